"""Tenants in a server's config and on its command line: `TenantConfig` (name, API keys, weight), the checks
across tenants, what a config derives from them (`TenantsMixin`), and the `--tenant` flags."""

from __future__ import annotations

import argparse
import re
from typing import Any

from pydantic import Field, field_validator

from ..api.config import Strict
from ..core import MAX_WEIGHT, MIN_WEIGHT

_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
# NOTE: the largest cost of a token (w_p, w_q): with weights down to MIN_WEIGHT and token counts up to 2**31 a
# request adds at most ~1e21 to a counter, finite for any realistic lifetime
MAX_COST = 1e6


class TenantConfig(Strict):
    name: str
    api_keys: list[str] = Field(min_length=1)
    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)

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


def parse_tenant(text: str) -> tuple[str, str, float | None]:
    """`NAME:KEY[:WEIGHT]` → (name, key, weight or None)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise ValueError(f"bad --tenant {text!r}: expected NAME:KEY or NAME:KEY:WEIGHT")
    weight = None
    if len(parts) == 3:
        try:
            weight = float(parts[2])
        except ValueError:
            raise ValueError(f"bad --tenant {text!r}: weight {parts[2]!r} is not a number") from None
    return parts[0], parts[1], weight


def tenants_from_flags(flags: list[str]) -> list[dict[str, Any]]:
    """Repeating a name adds keys to that tenant (`--tenant a:k1 --tenant a:k2:2`)."""
    tenants: dict[str, dict[str, Any]] = {}
    for text in flags:
        name, key, weight = parse_tenant(text)
        t = tenants.setdefault(name, {"name": name, "api_keys": []})
        t["api_keys"].append(key)
        if weight is not None:
            t["weight"] = weight
    return list(tenants.values())


# flag dest -> config key, for the flags of add_server_arguments
SERVER_SCALARS = {
    "w_p": "w_p",
    "w_q": "w_q",
    "admin_key": "admin_key",
    "max_body_bytes": "max_body_bytes",
    "client_timeout": "client_timeout_s",
    "drain_timeout": "drain_timeout_s",
    "metrics_key": "metrics_key",
}


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """The flags `fairserve gateway` and `fairserve serve` share: tenants, costs, admin key, body size, the client
    and drain timeouts, the /metrics key."""
    p.add_argument("--tenant", action="append", metavar="NAME:KEY[:WEIGHT]", help="a tenant and its API key; repeat")
    p.add_argument("--w-p", type=float, metavar="W", help="cost of a prompt token (default 1)")
    p.add_argument("--w-q", type=float, metavar="W", help="cost of an output token (default 2)")
    p.add_argument("--admin-key", metavar="KEY", help="Bearer key of the admin API (default: admin API off)")
    p.add_argument("--max-body-bytes", type=int, metavar="N", help="largest request body (default 4 MiB)")
    p.add_argument(
        "--client-timeout",
        type=float,
        metavar="S",
        help="a client's request headers, and its body, must each arrive within this (30)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        metavar="S",
        help="on SIGTERM, in-flight requests get this long, then end with an error (30)",
    )
    p.add_argument("--metrics-key", metavar="KEY", help="Bearer key /metrics requires (default: /metrics is open)")
