"""Tenants in a server's config and on its command line: `TenantConfig` (a path, API keys, weight, priority and
the priorities its requests may name) and `GroupConfig` (a group of the tenant tree: weight, priority), the checks
across them, the keys every server takes and what a config derives from them (`ServerConfig`: the ledger's
weights, priorities and allowed values), and the `--tenant` / `--group` flags' readers. The gateway and `fairserve
serve` share all of it."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Literal, Self, TypeVar

from pydantic import Field, PrivateAttr, StrictInt, field_validator, model_validator

from ..api.config import MAX_PROBLEMS, Strict
from ..api.keys import key
from ..core import MAX_WEIGHT, MIN_WEIGHT
from ..core.account import SEP, parents
from .flags import groups_from_flags, tenants_from_flags
from .index import KeyOwners, TenantIndex, drain, key_digest, set_of

_PART = r"[A-Za-z0-9_.@-]{1,64}"
_NAME = re.compile(rf"^{_PART}(?:/{_PART}){{0,7}}$")  # a path of at most 8 levels: `tier/org/team/key`
MAX_PATH = 255
MAX_PRIORITY = 2**31 - 1  # vLLM's `priority` is a 32-bit integer; lower is served first
# NOTE: the largest cost of a token (w_p, w_q): with weights down to MIN_WEIGHT and token counts up to 2**31 a
# request adds at most ~1e21 to a counter, finite for any realistic lifetime
MAX_COST = 1e6
T = TypeVar("T")


def check_path(v: str) -> str:
    if len(v) > MAX_PATH or not _NAME.match(v):
        raise ValueError(
            "must be a name of 1-64 characters of letters, digits, '_', '.', '@' or '-', or a path of such names "
            f"separated by '/' (at most 8, e.g. pro/acme/search), got {v!r}"
        )
    return v


Priority = Field(None, ge=-MAX_PRIORITY, le=MAX_PRIORITY, strict=True)
ModelsField = Field(None, max_length=1024)


def check_models(v: list[str] | None) -> list[str] | None:
    if v is not None and any(not m or m != m.strip() for m in v):
        raise ValueError("model ids must be non-empty, without surrounding spaces")
    return v


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class QuotaConfig(Strict):
    """`quota = { tokens = N, service = S, per = "day" }` on a tenant or a group: raw prompt + output tokens and/or
    weighted service per UTC hour, day or calendar month (gateway/quota/book.py)."""

    per: Literal["hour", "day", "month"]
    tokens: int | None = Field(None, gt=0, strict=True)
    service: float | None = Field(None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _some(self) -> QuotaConfig:
        if self.tokens is None and self.service is None:
            raise ValueError("a quota needs `tokens`, `service` or both")
        return self


class RateConfig(Strict):
    """`rate = { requests = N, tokens = M }` on a tenant or a group: at most N requests and/or M tokens (each
    request's footprint, prompt + output bound, counted at arrival) per UTC minute (gateway/rate/caps.py). One table,
    whatever sets it: the config file or, later, the keys API."""

    requests: int | None = Field(None, gt=0, strict=True)
    tokens: int | None = Field(None, gt=0, strict=True)

    @model_validator(mode="after")
    def _some(self) -> RateConfig:
        if self.requests is None and self.tokens is None:
            raise ValueError("a rate cap needs `requests`, `tokens` or both (per minute)")
        return self


class TenantConfig(Strict):
    name: str  # a path: `pro/acme/search` is the tenant `search` in the group `pro/acme`, in the group `pro`
    api_keys: list[str] = Field(default_factory=list)
    # keys given by their hex SHA-256 only, so that the config file holds no key
    api_key_sha256: list[str] = Field(default_factory=list)
    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)
    priority: int | None = Priority  # its own (lower is served first); None: its nearest group's, else 0
    # the priorities its requests may name (vLLM's `priority` field); its own is always allowed
    priorities: list[StrictInt] = Field(default_factory=list, max_length=64)
    models: list[str] | None = ModelsField  # the model ids it may use (None: any; its groups may limit it too)
    quota: QuotaConfig | None = None
    rate: RateConfig | None = None  # per-minute caps (a product limit; fair share orders what they let through)

    _name = field_validator("name")(classmethod(lambda cls, v: check_path(v)))
    _models = field_validator("models")(classmethod(lambda cls, v: check_models(v)))

    @field_validator("api_key_sha256")
    @classmethod
    def _digests(cls, v: list[str]) -> list[str]:
        for d in v:
            if not isinstance(d, str) or not _SHA256.match(d.strip().lower()):
                raise ValueError(f"must be hex SHA-256 digests of 64 characters (printf %s KEY | sha256sum), got {d!r}")
        return [d.strip().lower() for d in v]

    @model_validator(mode="after")
    def _has_key(self) -> TenantConfig:
        # NOTE: `api_keys = []` given: its keys are made through the gateway's API (`POST /admin/keys`)
        if not self.api_keys and not self.api_key_sha256 and "api_keys" not in self.model_fields_set:
            raise ValueError(
                f"tenant {self.name!r} needs api_keys or api_key_sha256 (at least one key; `api_keys = []`: its keys "
                "are made through the gateway's API)"
            )
        return self

    def digests(self) -> list[str]:
        """Every key's hex SHA-256: the hashed ones and those given in clear."""
        return [*self.api_key_sha256, *map(key_digest, self.api_keys)]

    @field_validator("priorities")
    @classmethod
    def _priorities(cls, v: list[int]) -> list[int]:
        for p in v:
            if isinstance(p, bool) or not isinstance(p, int) or abs(p) > MAX_PRIORITY:
                raise ValueError(f"priorities must be integers from {-MAX_PRIORITY} to {MAX_PRIORITY}, got {p!r}")
        return sorted(set(v))

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        if any(not k or k != k.strip() for k in v):
            raise ValueError("API keys must be non-empty, without surrounding spaces")
        return v


class GroupConfig(Strict):
    """A group of the tenant tree (a prefix of some tenant's path): its weight among its siblings and its
    priority (its tenants' unless they set their own)."""

    name: str
    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)
    priority: int | None = Priority
    models: list[str] | None = ModelsField  # the model ids its tenants may use (None: any)
    quota: QuotaConfig | None = None  # on its tenants' use in total
    rate: RateConfig | None = None  # per-minute caps on its tenants' requests in total

    _name = field_validator("name")(classmethod(lambda cls, v: check_path(v)))
    _models = field_validator("models")(classmethod(lambda cls, v: check_models(v)))


def check_tenants(tenants: list[TenantConfig], admin_key: str | None, groups: Sequence[GroupConfig] = ()) -> None:
    """Unique names; a tenant is no group (no tenant's path runs through another tenant); every group is a prefix of
    some tenant's path, given once; a key belongs to one tenant and is not the admin key. Linear in tenants and keys
    (a reload of 100,000 tenants checks them in a fraction of a second)."""
    names = [t.name for t in tenants]
    unique = set_of(names)
    if len(unique) != len(names):
        dup = sorted(n for n, times in Counter(names).items() if times > 1)
        more = f" and {len(dup) - MAX_PROBLEMS} more" if len(dup) > MAX_PROBLEMS else ""
        raise ValueError(f"tenant names must be unique; repeated: {', '.join(dup[:MAX_PROBLEMS])}{more}")
    known = _groups_of(names)
    if not unique.isdisjoint(known):
        n = next(n for n in names if n in known)
        raise ValueError(f"{n!r} is a tenant, so it cannot also be a group of tenants (a path runs through it)")
    seen: set[str] = set()
    for g in groups:
        if g.name in seen:
            raise ValueError(f"group names must be unique; repeated: {g.name}")
        seen.add(g.name)
        if g.name not in known:
            what = "a tenant, not a group" if g.name in unique else "no group of the configured tenants"
            raise ValueError(f"groups: {g.name!r} is {what} (a group is a prefix of a tenant's path, e.g. pro/acme)")
    # NOTE: by digest where some key is given hashed (a key in clear and the same key hashed are one key); else by
    # the keys themselves, with no hashing
    hashed = any(t.api_key_sha256 for t in tenants)
    owner: dict[str, str] = {}
    for t in tenants:
        for k in t.digests() if hashed else t.api_keys:
            if owner.setdefault(k, t.name) != t.name:
                raise ValueError(f"an API key is shared by tenants {owner[k]!r} and {t.name!r}")
    if admin_key is not None and (found := owner.get(key_digest(admin_key) if hashed else admin_key)) is not None:
        raise ValueError(f"admin_key is also an API key of tenant {found!r}")


def _groups_of(names: Iterable[str]) -> set[str]:
    """Every proper prefix of the paths (`a/b/c`: `a/b`, `a`), each path walked up only until a prefix already
    seen (whose own prefixes are in then)."""
    out: set[str] = set()
    for n in names:
        cut = n.rfind(SEP)
        while cut > 0:
            group = n[:cut]
            if group in out:
                break
            out.add(group)
            cut = n.rfind(SEP, 0, cut)
    return out


SERVER_START = "the HTTP server's, set when it starts"


class ServerConfig(Strict):
    """The keys every server in front of a ledger takes (the gateway's `GatewayConfig`, `fairserve serve`'s
    `ServeConfig`), declared once, and what a config derives from its tenants and groups."""

    # NOTE: `listen` and `policy` are each server's own: their defaults and checks differ
    listen: str
    tenants: list[TenantConfig] = key(
        default_factory=list,
        help="a tenant (a name, or a path org/team/name in the tenant tree) and its API key; a repeated path adds a "
        "key",
        flag="--tenant",
        metavar="PATH:KEY[:WEIGHT]",
        read=lambda flags: tenants_from_flags(flags),
        doc="`name` (a name, or a path `tier/org/name` in the tenant tree), `api_keys` and/or `api_key_sha256` (keys "
        "given by their hex SHA-256, see [Tenants, keys and weights](gateway.md#tenants-keys-and-weights)), `weight` "
        "(1), `priority` (none: its group's), `priorities` (`[]`: the values its requests may name besides its own); "
        "`models` (none: any): the model ids it may use; `quota` and `rate` (none, the gateway only). `api_keys = "
        "[]` (the gateway only): its keys are made through the admin API (`POST /admin/keys`). With none, no key is "
        "checked and everyone is one tenant, `anonymous` (the gateway's keyless mode, said at start)",
    )
    groups: list[GroupConfig] = key(
        default_factory=list,
        help="a group of the tenant tree (a prefix of tenants' paths): its weight and priority (lower first)",
        flag="--group",
        metavar="PATH:WEIGHT[:PRIORITY]",
        read=lambda flags: groups_from_flags(flags),
        doc="`name` (a prefix of tenants' paths), `weight` (1), `priority` (none: its parent's, else 0), `models` "
        "(none: any): the model ids its tenants may use; `quota` and `rate` (none): on its tenants' use in total, see "
        "[Quotas](gateway.md#quotas) and [Rate caps](gateway.md#rate-caps)",
    )
    w_p: float = key(1.0, help="cost of a prompt token (0 to 1e6)", ge=0, le=MAX_COST, allow_inf_nan=False)
    w_q: float = key(2.0, help="cost of an output token (0 to 1e6)", ge=0, le=MAX_COST, allow_inf_nan=False)
    admin_key: str | None = key(
        None,
        help="Bearer key of the admin API",
        metavar="KEY",
        shown="none (admin API off)",
        restart="the admin API takes it at start",
    )
    max_body_bytes: int = key(4 * 1024 * 1024, help="largest request body", shown="4 MiB", ge=1)
    client_timeout_s: float = key(
        30.0,
        help="a client's request line and headers, and then its body, must each arrive within this (408)",
        restart=SERVER_START,
        gt=0,
        le=3600,
    )
    drain_timeout_s: float = key(
        30.0, help="on SIGTERM/SIGINT, in-flight requests get this long to finish", restart=SERVER_START, ge=0, le=3600
    )
    metrics_key: str | None = key(
        None, help="Bearer key that /metrics requires", metavar="KEY", shown="none (/metrics is open)"
    )
    _derived: dict[Hashable, Any] = PrivateAttr(default_factory=dict)  # `derived`'s values

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def weights(self) -> dict[str, float]:
        """Every node's weight, by path: the tenants', then the groups'."""
        out = {t.name: t.weight for t in self.tenants}
        out.update((g.name, g.weight) for g in self.groups)
        return out

    def priorities(self) -> dict[str, int]:
        """The nodes that set a priority, by path."""
        out = {t.name: t.priority for t in self.tenants if t.priority is not None}
        out.update((g.name, g.priority) for g in self.groups if g.priority is not None)
        return out

    def allowed(self) -> dict[str, list[int]]:
        """By tenant, the priorities its requests may name, its own level included (tenants that set `priorities`)."""
        return {t.name: t.priorities for t in self.tenants if t.priorities}

    def level_of(self, tenant: str) -> int:
        """The priority `tenant`'s requests run at when they name none: its own, else its nearest group's, else 0."""
        own = self.priorities()
        for node in (tenant, *parents(tenant)):
            if node in own:
                return own[node]
        return 0

    def engine_env(self, policy: str, w_p: float, w_q: float) -> dict[str, str]:
        """The FAIRSERVE_* environment of a vLLM engine running fairserve's scheduler (docs/vllm.md) that keeps
        the same tree: weights, priorities and allowed values by the same paths, the same policy and costs."""
        env = {"FAIRSERVE_POLICY": policy, "FAIRSERVE_WP": f"{w_p:g}", "FAIRSERVE_WQ": f"{w_q:g}"}
        weights = {n: w for n, w in self.weights().items() if w != 1.0}
        if weights:
            env["FAIRSERVE_WEIGHTS"] = ",".join(f"{n}={w:g}" for n, w in weights.items())
        if priorities := self.priorities():
            env["FAIRSERVE_PRIORITIES"] = ",".join(f"{n}={p}" for n, p in priorities.items())
        if allowed := self.allowed():
            env["FAIRSERVE_ALLOWED_PRIORITIES"] = ",".join(f"{n}={'|'.join(map(str, v))}" for n, v in allowed.items())
        return env

    def named_allowed(self, tenant: str) -> list[int]:
        """The priorities a request of `tenant` may name: its own level and its `priorities`."""
        configured = next((t.priorities for t in self.tenants if t.name == tenant), [])
        return sorted({self.level_of(tenant), *configured})

    def allowed_models(self) -> dict[str, frozenset[str]]:
        """By tenant, the models it may use, where it or a group above it names some (`models = [...]`): those
        every one of them allows. A tenant absent may use any."""
        limits = {g.name: g.models for g in self.groups if g.models is not None}
        limits.update((t.name, t.models) for t in self.tenants if t.models is not None)
        out: dict[str, frozenset[str]] = {}
        if not limits:
            return out
        for t in self.tenants:
            allowed: frozenset[str] | None = None
            for node in (t.name, *parents(t.name)):
                if (names := limits.get(node)) is not None:
                    allowed = frozenset(names) if allowed is None else allowed & frozenset(names)
            if allowed is not None:
                out[t.name] = allowed
        return out

    def key_owners(self) -> KeyOwners:
        return KeyOwners(self.tenants)

    def quotas(self) -> dict[str, QuotaConfig]:
        """The nodes (tenants and groups) with a quota, by path."""
        out = {t.name: t.quota for t in self.tenants if t.quota is not None}
        out.update((g.name, g.quota) for g in self.groups if g.quota is not None)
        return out

    def rates(self) -> dict[str, RateConfig]:
        """The nodes (tenants and groups) with a rate cap, by path."""
        out = {t.name: t.rate for t in self.tenants if t.rate is not None}
        out.update((g.name, g.rate) for g in self.groups if g.rate is not None)
        return out

    def derived(self, name: Hashable, make: Callable[[], T]) -> T:
        """`make()`, made once per config and kept: what a server derives from it for its requests (`index()`, a
        reload's change of the tenant tree). A live reload makes them off the event loop, so that putting the new
        configuration in place is O(what changed) there. NOTE: a config is not changed once made."""
        memo = self._derived
        if name not in memo:
            memo[name] = make()
        return memo[name]

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if not name.startswith("_") and self.__pydantic_private__:
            self._derived.clear()  # NOTE: a key set after `derived` was read (a test's config): made again

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        out = super().model_copy(update=update, deep=deep)
        out._derived = {}
        return out

    def release(self) -> None:
        """Free what this config holds per tenant a piece at a time (a live reload's old one, on a thread, once nothing
        else holds it): at once, 100,000 tenants take 50 ms in one go, in which no other thread (the event loop) runs;
        a piece at a time, the loop runs between them."""
        drain(self.tenants)
        memo = self._derived
        while memo:
            _, made = memo.popitem()
            if isinstance(made, TenantIndex):
                # NOTE: the set first, while the list holds its names: freeing it then frees no name (1 ms, not 4)
                made.name_set = frozenset()
                drain(made.names, made.owners.clear, made.owners.hashed, made.quotas, made.rates, made.allowed_models)

    def index(self) -> TenantIndex:
        """The tenants' names, key owners, quotas, rate caps and model access, made once (`derived`)."""
        return self.derived("index", lambda: TenantIndex(self))
