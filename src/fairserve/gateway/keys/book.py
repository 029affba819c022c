"""The keys made through the admin API (`POST /admin/keys`): each a record (`KeyRecord`: its id, tenant, optional
name and expiry, the SHA-256 of the key and its first characters, never the key), and the book a request reads
(`KeyBook.owner`): by the key's digest, for a tenant the config names, until its expiry.

A key's last use is kept per second in the process (a dict write at most once a second per key, no I/O on the
request path); the part flushes it to the store in batches (gateway/keys/gate.py), and a listing shows the latest of
this replica's and the store's."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ...api.config import one_line
from ...tenancy import QuotaConfig
from ...tenancy.index import key_digest

KEY_PREFIX = "fs-"  # every key the API makes starts so (a secret scanner can tell them)
SHOWN = 8  # the characters of a key kept in clear to tell keys apart: the prefix and 5 more
MAX_NAME = 200  # characters of a key's name
MAX_KEYS = 100_000  # keys the API keeps in all (each costs a record on every replica)
MAX_LIFE_S = 100 * 365 * 86400  # the latest expiry: about a century from now
FIELDS = ("tenant", "name", "expires_at", "expires_in_s", "budget", "new_tenant")
BUDGET = "key:"  # a key's budget is the quota of the node `key:ID` (no tenant or group name has a ':')


class Refused(Exception):
    """A request to the keys API that cannot be done: its status, code, one-line message and the field at fault."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param


@dataclass(frozen=True)
class KeyRecord:
    id: str
    tenant: str
    sha256: str  # the key's hex SHA-256, as `api_key_sha256` gives it
    prefix: str  # its first `SHOWN` characters
    created_at: float  # unix seconds
    name: str | None = None
    expires_at: float | None = None  # unix seconds; None: never
    budget: QuotaConfig | None = None  # its own quota, beside its tenant's (the node `key:ID`)

    def doc(self) -> dict[str, Any]:
        budget = self.budget.model_dump(exclude_none=True) if self.budget is not None else None
        return {
            "id": self.id,
            "tenant": self.tenant,
            "sha256": self.sha256,
            "prefix": self.prefix,
            "created_at": self.created_at,
            "name": self.name,
            "expires_at": self.expires_at,
            **({"budget": budget} if budget is not None else {}),
        }

    @property
    def node(self) -> str:
        """The node its budget is the quota of."""
        return BUDGET + self.id

    @classmethod
    def read(cls, doc: Any) -> KeyRecord:
        """A record from its stored JSON object; ValueError (one line) for anything else."""
        try:
            budget = doc.get("budget") if isinstance(doc, dict) else None
            rec = cls(**{**doc, "budget": QuotaConfig.model_validate(budget) if budget is not None else None})
            ok = all(isinstance(getattr(rec, f), str) for f in ("id", "tenant", "sha256", "prefix"))
            ok = ok and len(rec.sha256) == 64 and isinstance(rec.created_at, int | float)
            ok = ok and isinstance(rec.name, str | None) and isinstance(rec.expires_at, int | float | None)
        except (TypeError, ValidationError):
            ok = False
        if not ok:
            raise ValueError(f"not a key record: {json.dumps(doc)[:200]}")
        return rec

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()


def new_key() -> str:
    """A fresh key: 256 random bits."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _expiry(doc: dict[str, Any], now: float) -> float | None:
    at, within = doc.get("expires_at"), doc.get("expires_in_s")
    if at is not None and within is not None:
        raise Refused(400, "invalid_expiry", "give expires_at or expires_in_s, not both", "expires_at")
    if within is not None:
        if isinstance(within, bool) or not isinstance(within, int | float) or not 0 < within <= MAX_LIFE_S:
            msg = f"expires_in_s must be a number of seconds > 0 and at most {MAX_LIFE_S}"
            raise Refused(400, "invalid_expiry", msg, "expires_in_s")
        return now + within
    if at is None:
        return None
    try:
        when = datetime.fromisoformat(at) if isinstance(at, str) else None
    except ValueError:
        when = None
    if when is None:
        msg = 'expires_at must be an ISO 8601 date and time, e.g. "2027-01-31T00:00:00Z" (UTC unless it says)'
        raise Refused(400, "invalid_expiry", msg, "expires_at")
    out = (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()
    if not now < out <= now + MAX_LIFE_S:
        raise Refused(400, "invalid_expiry", f"expires_at {at!r} is not in the next hundred years", "expires_at")
    return out


@dataclass(frozen=True)
class Create:
    """What a `POST /admin/keys` asks: a key of `tenant`, named, expiring; `new_tenant`: the tenant's own table
    when the key makes it (gateway/keys/tenants.py; None: a key of an existing tenant)."""

    tenant: str
    name: str | None
    expires_at: float | None
    budget: QuotaConfig | None
    new_tenant: Any


def parse_create(body: bytes, now: float) -> Create:
    """What a `POST /admin/keys` body asks; Refused (400) for anything else (`new_tenant` is checked by the part)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("tenant"), str) or not doc["tenant"]:
        msg = (
            'expected a JSON body {"tenant": NAME, "name"?: TEXT, "expires_at"?: ISO_TIME, "expires_in_s"?: S, '
            '"new_tenant"?: {...}}'
        )
        raise Refused(400, "invalid_request", msg, "tenant")
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        msg = f"unknown field {unknown[0]!r} (a key's fields: {', '.join(FIELDS)})"
        raise Refused(400, "invalid_request", msg, unknown[0])
    name = doc.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME or not name.isprintable()):
        raise Refused(400, "invalid_request", f"name must be printable text of at most {MAX_NAME} characters", "name")
    return Create(doc["tenant"], name, _expiry(doc, now), _budget(doc.get("budget")), doc.get("new_tenant"))


def _budget(doc: Any) -> QuotaConfig | None:
    if doc is None:
        return None
    try:
        return QuotaConfig.model_validate(doc)
    except ValidationError as e:
        msg = one_line(e).replace("config key '", "budget: '").replace("config: ", "budget: ")
        raise Refused(400, "invalid_request", f'{msg} (e.g. {{"tokens": 100000, "per": "day"}})', "budget") from None


class KeyBook:
    """The records by id and by digest, the tenants the config names now (`tenants`), and this replica's last use of
    each key (per second: `used`; those not yet flushed: `unsent`)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.records: dict[str, KeyRecord] = {}
        self.by_digest: dict[str, KeyRecord] = {}
        self.budgets: dict[str, str] = {}  # digest -> the node of the key's budget, for the keys that have one
        self.tenants: frozenset[str] = frozenset()
        self.used: dict[str, int] = {}  # id -> the unix second it was last presented here
        self.unsent: dict[str, int] = {}

    def load(self, records: Iterable[KeyRecord]) -> None:
        """Every record from now on (a store's whole set): a key it lacks is refused from the next request."""
        records = list(records)
        self.records = {r.id: r for r in records}
        self.by_digest = {r.sha256: r for r in records}
        self.budgets = {r.sha256: r.node for r in records if r.budget is not None}
        self.used = {i: s for i, s in self.used.items() if i in self.records}
        self.unsent = {i: s for i, s in self.unsent.items() if i in self.records}

    def add(self, rec: KeyRecord) -> None:
        self.records[rec.id] = rec
        self.by_digest[rec.sha256] = rec
        if rec.budget is not None:
            self.budgets[rec.sha256] = rec.node

    def remove(self, key_id: str) -> KeyRecord | None:
        rec = self.records.pop(key_id, None)
        if rec is not None:
            self.by_digest.pop(rec.sha256, None)
            self.budgets.pop(rec.sha256, None)
            self.used.pop(key_id, None)
            self.unsent.pop(key_id, None)
        return rec

    def owner(self, key: str) -> str | None:
        """The tenant of `key` (the request path: `KeyOwners.more`): None unless it is a key of the book, not expired,
        of a tenant the config names; its use is noted (once a second)."""
        if not self.by_digest:  # NOTE: no hashing on the way of requests while the API made no key
            return None
        rec = self.by_digest.get(key_digest(key))
        if rec is None or rec.tenant not in self.tenants:
            return None
        now = self.clock()
        if rec.expired(now):
            return None
        second = int(now)
        if self.used.get(rec.id) != second:
            self.used[rec.id] = self.unsent[rec.id] = second
        return rec.tenant

    def budget(self, key: str) -> str | None:
        """The node of `key`'s budget (the request path, after `owner`, only while some key has a budget)."""
        return self.budgets.get(key_digest(key))

    def budget_quotas(self) -> dict[str, QuotaConfig]:
        """Every key's budget, by its node (the quota gate's)."""
        return {r.node: r.budget for r in self.records.values() if r.budget is not None}

    def knows(self, key: str) -> bool:
        """Whether `key` is one of the book's, whether or not it serves (off the request path)."""
        return bool(self.by_digest) and key_digest(key) in self.by_digest

    def refusal(self, key: str | None) -> str | None:
        """Why a key of the book was refused (the 401's message; off the request path), None for any other key."""
        rec = self.by_digest.get(key_digest(key)) if key is not None and self.by_digest else None
        if rec is None:
            return None
        if rec.tenant not in self.tenants:
            return (
                f"API key {rec.prefix}... ({rec.id}) names tenant {rec.tenant!r}, which the configuration no longer has"
            )
        if rec.expired(self.clock()):
            return f"API key {rec.prefix}... ({rec.id}) expired at {iso(rec.expires_at)}"
        return None

    def take_unsent(self) -> dict[str, int]:
        out, self.unsent = self.unsent, {}
        return out

    def rows(self, stored_use: dict[str, int]) -> list[dict[str, Any]]:
        """Every key as `GET /admin/keys` lists it (never the key, nor its digest), oldest first."""
        now = self.clock()
        return [
            self.row(rec, max(self.used.get(rec.id, 0), stored_use.get(rec.id, 0)), now)
            for rec in sorted(self.records.values(), key=lambda r: (r.created_at, r.id))
        ]

    def row(self, rec: KeyRecord, last_used: int, now: float) -> dict[str, Any]:
        return {
            "id": rec.id,
            "name": rec.name,
            "prefix": rec.prefix,
            "tenant": rec.tenant,
            "created_at": iso(rec.created_at),
            "expires_at": iso(rec.expires_at),
            "last_used_at": iso(last_used) if last_used else None,
            "expired": rec.expired(now),
            "orphaned": rec.tenant not in self.tenants,
            "budget": rec.doc().get("budget"),
        }


def make(asked: Create, now: float) -> tuple[str, KeyRecord]:
    """A fresh key and its record (a fresh id)."""
    key = new_key()
    rec = KeyRecord(
        "key_" + secrets.token_hex(8),
        asked.tenant,
        key_digest(key),
        key[:SHOWN],
        now,
        asked.name,
        asked.expires_at,
        asked.budget,
    )
    return key, rec
