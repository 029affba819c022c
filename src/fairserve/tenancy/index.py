"""What the requests read of a configuration's tenants, made once per configuration (`ServerConfig.index`): the
keys' owners (`KeyOwners`), the names, the quotas, the rate caps and the tenants limited to some models
(`TenantIndex`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .config import ServerConfig, TenantConfig

T = TypeVar("T")
PIECE = 4096  # items a set takes in one call (`set_of`)


class KeyOwners:
    """Which tenant owns an API key: those given in clear by a dict lookup, those given hashed (`api_key_sha256`) by
    the lookup of the key's SHA-256 (only when some are configured: no hashing on the way of the others), then those
    kept elsewhere (`more`: the gateway's keys made through its API, gateway/keys/), asked last: a key the config
    names is its config tenant's."""

    __slots__ = ("clear", "hashed", "more")

    def __init__(self, tenants: Sequence[TenantConfig]) -> None:
        self.clear = {k: t.name for t in tenants for k in t.api_keys}
        self.hashed = {d: t.name for t in tenants for d in t.api_key_sha256}
        self.more: Callable[[str], str | None] | None = None

    def get(self, key: str | None, default: str | None = None) -> str | None:
        if key is None:
            return default
        owner = self.clear.get(key)
        if owner is None and self.hashed:
            owner = self.hashed.get(key_digest(key))
        if owner is None and self.more is not None:
            owner = self.more(key)
        return owner if owner is not None else default

    def replace(self, other: KeyOwners) -> None:
        """Take `other`'s keys (a reload): whoever holds this object sees them at once; `more` is kept (the keys made
        through the API outlive a reload)."""
        self.clear, self.hashed = other.clear, other.hashed

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None


class TenantIndex:
    """What the requests read of a config's tenants, made once per config (`ServerConfig.index`): the names in
    order and as a set, the keys' owners, the quotas, the rate caps and the tenants limited to some models. Read
    only."""

    __slots__ = ("names", "name_set", "owners", "quotas", "rates", "allowed_models")

    def __init__(self, cfg: ServerConfig) -> None:
        self.names = [t.name for t in cfg.tenants]
        self.name_set = frozenset(set_of(self.names))  # NOTE: from a set: half the time of a list's (1.5-2 ms)
        self.owners = cfg.key_owners()
        self.quotas = cfg.quotas()
        self.rates = cfg.rates()
        self.allowed_models = cfg.allowed_models()


def set_of(items: Sequence[T]) -> set[T]:
    """`set(items)`, made `PIECE` items at a time. NOTE: at once, 100,000 names hold the interpreter 3-4 ms, in which
    no other thread runs (a live reload checks and indexes a configuration on one, beside the event loop); a piece
    at a time, under 1 ms."""
    out: set[T] = set()
    for start in range(0, len(items), PIECE):
        out.update(items[start : start + PIECE])
    return out


def drain(*parts: list[Any] | dict[Any, Any]) -> None:
    """Empty each list or dict an item at a time (`ServerConfig.release`)."""
    for part in parts:
        while part:
            part.popitem() if isinstance(part, dict) else part.pop()


def key_digest(key: str) -> str:
    """The hex SHA-256 of an API key, as `api_key_sha256` gives it (`printf %s KEY | sha256sum`)."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
