"""`fairserve serve` configuration: the gateway's tenants, keys, weights, policy and costs, plus the engine's model
and sizing. A TOML file and/or flags, validated into one `ServeConfig` (one error line naming the key)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..api.config import Strict, check_listen
from ..api.config import load_config as _load
from ..api.protocol import MAX_INT
from ..core import check_policy
from ..tenancy import MAX_COST, GroupConfig, TenantConfig, TenantsMixin, check_tenants

ENGINES = ("transformers",)


class ServeConfig(TenantsMixin, Strict):
    listen: str = "127.0.0.1:8000"
    engine: Literal["transformers"] = "transformers"
    model: str = "tiny-random"  # a preset (tiny-random, small-random) or a local model directory
    served_model_name: str | None = None  # the name /v1/models lists (default: `model`)
    tenants: list[TenantConfig] = Field(default_factory=list)  # none: no API keys, one tenant "anonymous"
    groups: list[GroupConfig] = Field(default_factory=list)  # weights and priorities of the tenant tree's groups
    policy: str = "vtc"  # the engine's scheduler; "fifo": transformers' own, no accounts
    w_p: float = Field(1.0, ge=0, le=MAX_COST)
    w_q: float = Field(2.0, ge=0, le=MAX_COST)
    admin_key: str | None = None
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1)
    default_max_tokens: int = Field(256, ge=1, le=MAX_INT)
    client_timeout_s: float = Field(30.0, gt=0, le=3600)  # a client's request headers, and its body, each (408)
    drain_timeout_s: float = Field(30.0, ge=0, le=3600)  # SIGTERM: in-flight requests get this long to finish
    metrics_key: str | None = None  # Bearer key required by /metrics (default: open)
    # engine sizing (transformers' ContinuousBatchingConfig); the KV pool holds num_blocks × page_size tokens
    num_blocks: int = Field(512, ge=1)
    page_size: int = Field(32, ge=4)
    max_batch_tokens: int = Field(512, ge=1)
    max_requests_per_batch: int = Field(64, ge=1)
    seed: int = 0  # of the random presets' weights

    _listen = field_validator("listen")(classmethod(lambda cls, v: check_listen(v)))

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v == "fifo":
            return v
        if check_policy(v)[0].capabilities.rejects_at_arrival:  # raises ValueError naming the valid policies
            raise ValueError(
                "rate limits reject requests, which an engine cannot do: put `fairserve gateway "
                "--policy rpm:N` in front instead"
            )
        return v

    @model_validator(mode="after")
    def _tenants(self) -> ServeConfig:
        check_tenants(self.tenants, self.admin_key, self.groups)
        if quotas := self.quotas():
            raise ValueError(
                f"quota (on {', '.join(sorted(quotas))}): `fairserve serve` does not enforce quotas; "
                "put `fairserve gateway` in front of it"
            )
        return self

    @property
    def open(self) -> bool:
        """No tenants configured: no API keys are checked and every request is from `DEFAULT_TENANT`."""
        return not self.tenants

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> ServeConfig:
    return _load(ServeConfig, path, overrides)
