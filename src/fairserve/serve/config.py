"""`fairserve serve` configuration: the gateway's tenants, keys, weights, policy and costs, plus the engine's model
and sizing. A TOML file and/or flags, validated into one `ServeConfig` (one error line naming the key)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import field_validator, model_validator

from ..api.config import check_listen
from ..api.config import load_config as _load
from ..api.keys import key
from ..api.protocol import MAX_INT
from ..core import check_policy
from ..tenancy import ServerConfig, check_tenants

ENGINES = ("transformers",)


class ServeConfig(ServerConfig):
    listen: str = key("127.0.0.1:8000", help="address to serve on", metavar="HOST:PORT")
    engine: Literal["transformers"] = key("transformers", help="the inference engine")
    model: str = key(
        "tiny-random",
        help="tiny-random or small-random: a random Llama built locally; or a local Hugging Face model directory "
        "(never downloaded)",
        metavar="NAME_OR_DIR",
    )
    served_model_name: str | None = key(
        None, help="the model name /v1/models lists", metavar="NAME", shown="the model's"
    )
    policy: str = key("vtc", help="the engine's scheduler", metavar="P")
    default_max_tokens: int = key(256, help="max_tokens when a request sets none", ge=1, le=MAX_INT)
    # NOTE: engine sizing (transformers' ContinuousBatchingConfig); the KV pool holds num_blocks × page_size tokens
    num_blocks: int = key(512, help="KV-cache blocks", ge=1)
    page_size: int = key(32, help="tokens per block (the pool: blocks × size)", ge=4)
    max_batch_tokens: int = key(512, help="tokens per forward pass", ge=1)
    max_requests_per_batch: int = key(64, help="requests per forward pass", ge=1)
    seed: int = key(0, help="seed of the random presets' weights")

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
        if keyless := [t.name for t in self.tenants if not t.api_keys and not t.api_key_sha256]:
            raise ValueError(
                f"tenant {keyless[0]!r} has no key: `fairserve serve` makes no keys through its API (give api_keys "
                "or api_key_sha256, or put `fairserve gateway` in front of it)"
            )
        if quotas := self.quotas():
            raise ValueError(
                f"quota (on {', '.join(sorted(quotas))}): `fairserve serve` does not enforce quotas; "
                "put `fairserve gateway` in front of it"
            )
        if rates := self.rates():
            raise ValueError(
                f"rate (on {', '.join(sorted(rates))}): `fairserve serve` does not enforce rate caps; "
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
