"""Gateway configuration: a TOML file and/or command-line flags, validated into one `GatewayConfig`.

Every validation problem becomes one `ValueError` line that names the offending key, e.g.
`config key 'backends.0.max_inflight_requests': Input should be greater than or equal to 1`.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..api.tokens import token_counter
from ..core import make_policy

M = TypeVar("M", bound=BaseModel)
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class BackendConfig(_Strict):
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


class TenantConfig(_Strict):
    name: str
    api_keys: list[str] = Field(min_length=1)
    weight: float = Field(1.0, gt=0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"must be 1-64 characters of letters, digits, '_', '.', '@' or '-', got {v!r}")
        return v

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        if any(not k or k != k.strip() for k in v):
            raise ValueError("API keys must be non-empty, without surrounding spaces")
        return v


def check_listen(v: str) -> str:
    host, sep, port = v.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be HOST:PORT, e.g. 127.0.0.1:8080, got {v!r}")
    return v


def check_tenants(tenants: list[TenantConfig], admin_key: str | None) -> None:
    """Unique names; a key belongs to one tenant and is not the admin key."""
    names = [t.name for t in tenants]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"tenant names must be unique; repeated: {', '.join(sorted(dup))}")
    owner: dict[str, str] = {}
    for t in tenants:
        for k in t.api_keys:
            if k in owner and owner[k] != t.name:
                raise ValueError(f"an API key is shared by tenants {owner[k]!r} and {t.name!r}")
            owner[k] = t.name
    if admin_key is not None and admin_key in owner:
        raise ValueError(f"admin_key is also an API key of tenant {owner[admin_key]!r}")


class TenantsMixin:
    """What a config with `listen`, `tenants` and `admin_key` derives (the gateway's and `fairserve serve`'s)."""

    listen: str
    tenants: list[TenantConfig]

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def weights(self) -> dict[str, float]:
        return {t.name: t.weight for t in self.tenants}

    def key_owners(self) -> dict[str, str]:
        return {k: t.name for t in self.tenants for k in t.api_keys}


class GatewayConfig(TenantsMixin, _Strict):
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

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        check_tenants(self.tenants, self.admin_key)
        urls = [b.url for b in self.backends]
        if len(set(urls)) != len(urls):
            raise ValueError("backend URLs must be unique")
        return self



def _one_line(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        key = ".".join(str(x) for x in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        parts.append(f"config key '{key}': {msg}" if key else f"config: {msg}")
    return "; ".join(parts).replace("\n", " ")


def build_config(data: dict[str, Any], model: type[M] = GatewayConfig) -> M:   # type: ignore[assignment]
    """Validate a dict (parsed TOML, possibly with flag overrides). Raises ValueError with one line."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ValueError(_one_line(e)) from None


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file not found: {p}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {p} is not valid TOML: {e}") from None


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """The file's keys, then `overrides` (e.g. from flags) on top; lists given as overrides replace the file's."""
    data = read_toml(path) if path is not None else {}
    data.update(overrides or {})
    return build_config(data)
