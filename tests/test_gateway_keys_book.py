"""Keys by API, the parts alone (no server, no clock): a store that fails makes no key and changes nothing (503
`key_store_unavailable`), a last use is noted once per second and kept for the next flush when one fails, and a
store's new set of records drops a revoked key at once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from support.gateway import config

from fairserve.gateway.keys.book import Create, KeyBook, Refused, make
from fairserve.gateway.keys.gate import ApiKeys
from fairserve.tenancy.index import KeyOwners

pytestmark = pytest.mark.unit

T0 = 1_798_761_600.0


class Failing:
    """A store whose every write fails, as a Redis that does not answer."""

    kind = "redis"

    async def create(self, rec, tenant, made_by_api) -> int:
        raise ConnectionError("Redis is gone")

    async def revoke(self, key_id: str) -> bool:
        raise ConnectionError("Redis is gone")

    async def flush(self, used) -> None:
        raise ConnectionError("Redis is gone")


def keys_with(store) -> ApiKeys:
    cfg = config(["http://127.0.0.1:9"])
    keys = ApiKeys(cfg, SimpleNamespace(shared=None), KeyOwners(cfg.tenants), clock=lambda: T0)
    keys.store = store
    return keys


def test_a_store_that_fails_makes_no_key_and_revokes_none():
    keys = keys_with(Failing())
    _, rec = make(Create("alice", None, None, None, None), T0)
    keys.book.add(rec)
    for call in (keys.create(b'{"tenant": "alice"}'), keys.revoke(rec.id)):
        with pytest.raises(Refused) as e:
            asyncio.run(call)
        assert e.value.status == 503 and e.value.code == "key_store_unavailable" and "Redis" in e.value.message
    assert list(keys.book.records) == [rec.id]  # nothing made, the key not dropped


def test_a_use_is_noted_once_a_second_and_kept_when_a_flush_fails():
    now = [T0]
    book = KeyBook(lambda: now[0])
    book.tenants = frozenset({"alice"})
    key, rec = make(Create("alice", "ci", None, None, None), T0)
    book.add(rec)
    assert book.owner(key) == "alice" and book.owner("fs-other") is None
    assert book.take_unsent() == {rec.id: int(T0)}
    now[0] = T0 + 0.5
    assert book.owner(key) == "alice" and book.unsent == {}  # the same second: nothing to write
    now[0] = T0 + 1
    book.owner(key)
    keys = keys_with(Failing())
    keys.book = book
    assert asyncio.run(keys._flush()) is False and book.unsent == {rec.id: int(T0) + 1}  # kept for the next one
    book.load([])  # the store's set no longer has it: revoked elsewhere
    assert book.owner(key) is None and book.unsent == {} and book.rows({}) == []
