"""Rate caps (gateway/rate/): fixed UTC minutes on an injected clock, Retry-After to the minute's end, a group's cap
on its tenants in total, tokens over by at most one request's footprint, a refused request counted nowhere, the
config's one-line errors, a reload's new caps on this minute's counts, and the replica's own count answering while
Redis cannot be reached (one warning), until a sync is answered again (one line)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from fairserve.gateway import build_config
from fairserve.gateway.admission.footprint import Footprint
from fairserve.gateway.rate.caps import Count, Limited, LocalCounts, RateBook, RateCap, minute
from fairserve.gateway.rate.gate import RateGate
from fairserve.gateway.rate.store import Estimate, OwnCounts

pytestmark = pytest.mark.unit

T0 = 1_798_761_540.0 + 47.25  # 2026-12-31 23:59:47.25 UTC: 12.75 s before the minute's (and the year's) end


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(coro):
    return asyncio.run(coro)


def test_windows_are_utc_minutes():
    assert minute(T0) == (1_798_761_540, 1_798_761_600)
    assert minute(1_798_761_600.0) == (1_798_761_600, 1_798_761_660)  # the end is the next minute's start
    assert minute(1_798_761_599.999)[1] == 1_798_761_600


@pytest.mark.parametrize(
    "bad, message",
    [({}, "needs `requests`, `tokens`"), ({"requests": 0}, "integer > 0"), ({"tokens": True}, "integer > 0")],
)
def test_bad_caps_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        RateCap(**bad)


def test_n_requests_a_minute_then_429_until_the_minute_ends():
    clock = Clock()
    book = RateBook({"alice": RateCap(requests=3)}, clock=clock)

    async def scenario() -> list[Limited | None]:
        return [await book.count(["alice"], 10) for _ in range(5)]

    got = run(scenario())
    assert got[:3] == [None, None, None]
    refused = got[3]
    assert isinstance(refused, Limited) and got[4] == refused  # a refused request is counted nowhere
    assert (refused.path, refused.measure, refused.limit, refused.used) == ("alice", "requests", 3, 3)
    assert refused.retry_after_s == 13  # 12.75 s to 00:00:00, rounded up
    assert "2027-01-01T00:00:00+00:00" in refused.message()
    clock.now = 1_798_761_599.9  # 0.1 s before the end: at least 1 s
    assert run(book.count(["alice"], 10)).retry_after_s == 1
    clock.now = 1_798_761_600.0  # the next minute: a fresh count
    assert run(book.count(["alice"], 10)) is None
    assert run(book.status("alice"))["requests"]["used"] == 1


def test_a_groups_cap_counts_its_tenants_in_total_and_the_tokens_end_at_most_one_footprint_over():
    book = RateBook({"org": RateCap(tokens=100), "org/a": RateCap(requests=50)}, clock=Clock())

    async def scenario() -> tuple[int, Limited]:
        served = 0
        paths = [["org"], ["org/a", "org"]]  # org/b (no cap of its own) and org/a, in turn
        while (out := await book.count(paths[served % 2], 30)) is None:
            served += 1
        return served, out

    served, out = run(scenario())
    assert served == 4 and (out.path, out.measure, out.used) == ("org", "tokens", 120)  # 90 < 100: one more let in
    status = run(book.status("org"))["tokens"]
    assert status["used"] == 120 and status["remaining"] == 0
    assert run(book.status("org/a"))["requests"]["used"] == 2  # only the requests of org/a count on its own cap
    assert run(book.status("nobody")) == {}


def test_a_request_refused_by_one_cap_is_counted_on_none():
    book = RateBook({"org": RateCap(requests=1), "org/a": RateCap(requests=5)}, clock=Clock())
    assert run(book.count(["org/b", "org"], 1)) is None
    out = run(book.count(["org/a", "org"], 1))
    assert isinstance(out, Limited) and out.path == "org"
    assert run(book.status("org/a"))["requests"]["used"] == 0


def test_the_estimate_is_the_last_read_plus_n_times_the_replicas_own_since():
    own = OwnCounts()
    key = ("alice", 60)
    own.add([key], 10)
    own.saw([key], [Count(7, 70)])  # Redis said 7 requests, 70 tokens, this replica's 1 and 10 among them
    own.add([key], 10)
    own.add([key], 10)
    assert own.estimate(key, 3) == Count(7 + 3 * 2, 70 + 3 * 20)
    assert own.estimate(("bob", 60), 3) == Count()  # never counted, never read
    own.add([("alice", 120)], 5)  # a later minute: the ended one is forgotten
    assert key not in own.counts and key not in own.seen
    estimate = Estimate(own, lambda: 2)
    assert run(estimate.read(("alice", 120))) == Count(2, 10)


def caps_config(**rates):
    tenants = [
        {"name": "org/alice", "api_keys": ["ka"], **({"rate": rates["alice"]} if "alice" in rates else {})},
        {"name": "bob", "api_keys": ["kb"]},
    ]
    groups = [{"name": "org", "rate": rates["org"]}] if "org" in rates else []
    return build_config({"backends": [{"url": "http://127.0.0.1:9"}], "tenants": tenants, "groups": groups})


@pytest.mark.parametrize(
    "rate, words",
    [
        ({"requests": 0}, "greater than 0"),
        ({"requests": 1.5}, "valid integer"),
        ({"per": "hour", "requests": 5}, "rate.per': Extra inputs are not permitted"),
        ({}, "needs `requests`, `tokens` or both"),
    ],
    ids=["zero", "not-an-integer", "unknown-key", "empty"],
)
def test_a_bad_rate_table_is_one_line(rate, words):
    with pytest.raises(ValueError) as e:
        caps_config(alice=rate)
    message = str(e.value)
    assert words in message and "rate" in message and "\n" not in message, message


def test_serve_refuses_rate_caps_with_one_line():
    from fairserve.serve.config import load_config as load_serve

    tenant = {"name": "a", "api_keys": ["k"], "rate": {"requests": 5}}
    with pytest.raises(ValueError, match="does not enforce rate caps") as e:
        load_serve(None, {"model": "tiny-random", "tenants": [tenant]})
    assert "\n" not in str(e.value)


def ticket(tenant: str, prompt: int = 10, output: int = 10):
    return SimpleNamespace(tenant=tenant, footprint=Footprint(prompt, output), request_id="r", model="m", kind="chat")


def sched_of(cfg, shared=None):
    refused: list[tuple[str, str]] = []
    metrics = SimpleNamespace(refused=lambda tenant, outcome: refused.append((tenant, outcome)))
    usage = SimpleNamespace(refused=lambda *args: None)
    return SimpleNamespace(cfg=cfg, shared=shared, metrics=metrics, usage=usage), refused


def test_the_gate_answers_429_rate_limited_and_a_reload_changes_the_caps_on_this_minutes_count():
    sched, refused = sched_of(caps_config(org={"requests": 2}))
    gate = RateGate(sched, clock=Clock())
    assert gate.on and gate.paths("org/alice") == ["org"] and gate.paths("bob") == []

    async def scenario():
        assert await gate.admit(ticket("org/alice")) is None
        assert await gate.admit(ticket("bob")) is None  # no cap on its path: nothing asked
        assert await gate.admit(ticket("org/alice")) is None
        out = await gate.admit(ticket("org/alice"))
        assert out.status_code == 429 and out.headers["retry-after"] == "13"
        assert b'"code":"rate_limited"' in out.body and b'"type":"rate_limit_error"' in out.body
        assert refused == [("org/alice", "rate_limited")]
        gate.configure(caps_config(org={"requests": 3}, alice={"tokens": 1000}))  # a reload: the count is kept
        assert gate.paths("org/alice") == ["org/alice", "org"]
        assert await gate.admit(ticket("org/alice")) is None  # 2 < 3
        assert await gate.admit(ticket("org/alice")) is not None
        doc = await gate.all_status()
        assert doc["rates"]["org"]["requests"] == {
            "limit": 3,
            "used": 3,
            "remaining": 0,
            "resets_at": "2027-01-01T00:00:00+00:00",
        }
        assert doc["rates"]["org/alice"]["tokens"]["used"] == 20  # counted from the reload on
        gate.configure(caps_config())  # every cap removed: the request path asks nothing
        assert not gate.on and await gate.admit(ticket("org/alice")) is None

    run(scenario())


def test_while_redis_cannot_be_reached_the_replicas_own_count_answers_with_one_warning(caplog):
    async def lost(*args, **kw):
        raise ConnectionError("redis is gone")

    client = SimpleNamespace(register_script=lambda text: lost, hmget=lost)
    shared = SimpleNamespace(_client=client, settings=SimpleNamespace(prefix="p"), replicas=2, up=True)
    shared.last_sync = 5.0
    sched, _ = sched_of(caps_config(alice={"requests": 4}), shared)
    gate = RateGate(sched, clock=Clock())

    async def scenario():
        await gate.start()
        # NOTE: 2 replicas last seen alive: each lets alice have about half of the 4
        assert await gate.count("org/alice", 1) is None and await gate.count("org/alice", 1) is None
        out = await gate.count("org/alice", 1)
        assert isinstance(out, Limited) and out.used == 4
        doc = await gate.all_status()
        assert doc["estimated"] and doc["rates"]["org/alice"]["requests"]["used"] == 4
        gate.book.store = LocalCounts()  # Redis answers again (here: a store that answers) ...
        assert isinstance(await gate.count("org/alice", 1), Limited)  # ... but no sync was answered since
        shared.last_sync = 6.0  # a sync answered: Redis decides again
        assert await gate.count("org/alice", 1) is None and not gate.local

    with caplog.at_level("WARNING", "fairserve.gateway"):
        run(scenario())
    assert [r.message for r in caplog.records] == [
        "rate caps are enforced from this replica's own count while Redis cannot be reached (ConnectionError)",
        "rate caps are enforced in Redis again",
    ]
