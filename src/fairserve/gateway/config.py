"""Gateway configuration: a TOML file and/or command-line flags, validated into one `GatewayConfig` (one error
line naming the key, see `api.config`). Tenants, keys and weights are `tenancy`'s."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from ..api.config import Strict, check_listen
from ..api.config import build_config as _build
from ..api.config import load_config as _load
from ..api.tokens import token_counter
from ..core import make_policy
from ..tenancy import TenantConfig, TenantsMixin, check_tenants


class BackendConfig(Strict):
    url: str
    max_inflight_requests: int = Field(32, ge=1)
    max_inflight_tokens: int | None = Field(None, ge=1)   # prompt + max_tokens of the requests in flight
    api_key: str | None = None                             # sent upstream as `Authorization: Bearer`
    adaptive: bool = False                                 # limit in-flight requests from the backend's /metrics
    metrics_url: str | None = None                         # default: URL/metrics (gateway/capacity.py)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"must be an http(s) URL like http://127.0.0.1:8000, got {v!r}")
        return v[: -len("/v1")] if v.endswith("/v1") else v

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v.strip()):
            raise ValueError(f"must be an http(s) URL like http://127.0.0.1:8000/metrics, got {v!r}")
        return v.strip() if v is not None else None


class GatewayConfig(TenantsMixin, Strict):
    listen: str = "127.0.0.1:8080"
    backends: list[BackendConfig] = Field(min_length=1)
    tenants: list[TenantConfig] = Field(min_length=1)
    policy: str = "vtc"
    w_p: float = Field(1.0, ge=0)
    w_q: float = Field(2.0, ge=0)
    queue_limit: int = Field(256, ge=1)           # queued requests per tenant
    queue_ttl_s: float = Field(300.0, gt=0)       # the longest a request may wait in the queue
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1)
    admin_key: str | None = None
    trusted_proxy: bool = False                   # honour `X-Tenant-Id` from a holder of a valid key
    tokenizer: str = ""                           # "estimate", "hf:PATH", "tiktoken:ENCODING[@PATH]" (api.tokens)
    default_max_tokens: int = Field(512, ge=1)    # assumed when a request sets no max_tokens
    models: list[str] = Field(default_factory=list)   # /v1/models when no backend answers
    backend_cooldown_s: float = Field(2.0, ge=0)  # an unreachable backend is skipped this long
    request_timeout_s: float = Field(600.0, gt=0) # upstream read timeout
    access_log: bool = True                       # uvicorn's line per request (`--no-access-log`)
    metrics_interval_s: float = Field(1.0, gt=0)  # how often adaptive backends' /metrics are read
    state: str | None = None                      # redis://[:PASSWORD@]HOST:PORT/DB (rediss:// TLS): shared by replicas
    state_interval_s: float = Field(0.02, gt=0, le=1.0)   # how often charges are flushed to the shared state
    state_ttl_s: float = Field(3.0, gt=0, le=60.0)        # a dead replica's leases and backlog expire after this

    _listen = field_validator("listen")(classmethod(lambda cls, v: check_listen(v)))

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        make_policy(v)   # raises ValueError naming the valid policies
        return v

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, v: str) -> str:
        token_counter(v)          # loads it now, so a bad name or file stops the gateway at start
        return v

    @field_validator("state")
    @classmethod
    def _state(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(redis|rediss|unix)://\S+$", v.strip()):
            raise ValueError(f"must be a Redis URL like redis://127.0.0.1:6379/0, got {v!r}")
        return v.strip() if v is not None else None

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        check_tenants(self.tenants, self.admin_key)
        urls = [b.url for b in self.backends]
        if len(set(urls)) != len(urls):
            raise ValueError("backend URLs must be unique")
        if self.state is not None:
            if self.policy.split(":")[0] not in ("vtc", "vtc-predict", "lcf"):
                raise ValueError(f"state: shared state needs a policy with virtual counters (vtc, vtc-predict, "
                                 f"lcf), not {self.policy!r}")
            if any(b.adaptive for b in self.backends):
                raise ValueError("state: adaptive backends cannot be combined with shared state (leases use "
                                 "max_inflight_requests)")
        return self



def build_config(data: dict[str, Any]) -> GatewayConfig:
    """Validate a dict (parsed TOML, possibly with flag overrides). Raises ValueError with one line."""
    return _build(data, GatewayConfig)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """The file's keys, then `overrides` (e.g. from flags) on top; lists given as overrides replace the file's."""
    return _load(GatewayConfig, path, overrides)
