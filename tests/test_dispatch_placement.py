"""The gateway's `dispatch` rules (gateway/dispatch/placement.py, locality.py): shuffle sharding deals each tenant a
deterministic hand of K backends, stable as backends come and go, and a tenant whose hand is full holds up no other
tenant; prefix dispatch lets a request wait for the backend holding its prefix, overtaken within DELTA only."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from support.gateway import config

from fairserve.gateway.admission.footprint import Footprint
from fairserve.gateway.admission.scheduler import Scheduler
from fairserve.gateway.admission.ticket import Ending
from fairserve.gateway.dispatch.placement import Placement, parse_placement
from fairserve.gateway.metrics.prometheus import GatewayMetrics

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class B:
    url: str


URLS = [B(f"http://engine-{i}") for i in range(8)]


def test_a_hand_is_k_backends_fixed_by_the_tenant_and_the_urls():
    p = parse_placement("shard:2")
    hands = {t: tuple(b.url for b in p.hand(t, URLS)) for t in (f"tenant-{i}" for i in range(200))}
    assert all(len(set(h)) == 2 for h in hands.values())
    assert hands == {t: tuple(b.url for b in Placement(2).hand(t, URLS)) for t in hands}  # a fresh one agrees
    # every pair of backends is some tenant's hand: the hands spread (C(8, 2) = 28 pairs, 200 tenants)
    assert len(set(hands.values())) >= 20
    assert Placement().hand("x", URLS) == URLS and Placement(9).hand("x", URLS) == URLS


def test_a_new_backend_changes_only_the_hands_that_rank_it_in():
    p, q = Placement(2), Placement(2)
    before = {t: {b.url for b in p.hand(t, URLS)} for t in (f"tenant-{i}" for i in range(300))}
    after = {t: {b.url for b in q.hand(t, [*URLS, B("http://engine-8")])} for t in before}
    moved = [t for t in before if before[t] != after[t]]
    assert all(after[t] - before[t] == {"http://engine-8"} and len(before[t] - after[t]) == 1 for t in moved)
    assert 0 < len(moved) < 0.4 * len(before)  # about K / (N + 1) = 2 / 9 of them


@pytest.mark.parametrize("bad", ["shard", "shard:0", "shard:x", "round_robin", ""])
def test_a_bad_rule_is_one_line(bad):
    with pytest.raises(ValueError, match="dispatch must be least_loaded, shard:K"):
        parse_placement(bad)
    with pytest.raises(ValueError, match="dispatch must be"):
        config(["http://a"], dispatch=bad)


def admitted_backends(rule: str) -> dict[str, list[str]]:
    """Four backends of one request each; `flood` queues 8 requests, then `heavy` 2 (their hands of 2 are disjoint):
    where each went."""

    async def go() -> dict[str, list[str]]:
        backends = [{"url": f"http://engine-{i}", "max_inflight_requests": 1} for i in range(4)]
        metrics = GatewayMetrics()
        s = Scheduler(config(backends, dispatch=rule), metrics)
        metrics.bind(s)
        tickets = [(t, s.new_ticket(t, Footprint(5, 5))) for t in ["flood"] * 8 + ["heavy"] * 2]
        for _, ticket in tickets:
            s.submit(ticket)
        out: dict[str, list[str]] = {"flood": [], "heavy": []}
        for tenant, ticket in tickets:
            if ticket.admitted.done():
                out[tenant].append(ticket.backend.url)
        return out

    return asyncio.run(go())


def test_with_shard_a_flooding_tenant_fills_its_hand_only_and_the_other_is_served_at_once():
    got = admitted_backends("shard:2")
    hand = {b.url for b in Placement(2).hand("flood", [B(f"http://engine-{i}") for i in range(4)])}
    assert sorted(got["flood"]) == sorted(hand)  # two of its eight: its hand's two slots
    assert len(got["heavy"]) == 2 and not set(got["heavy"]) & hand  # NOTE: passed over the flood's queued requests
    # negative control: least_loaded lets the flood take every backend, and the other tenant waits
    every = admitted_backends("least_loaded")
    assert len(every["flood"]) == 4 and every["heavy"] == []


def test_dispatch_is_a_live_key():
    from fairserve.api.keys import reload_keys
    from fairserve.gateway.settings.config import GatewayConfig

    live, _ = reload_keys(GatewayConfig)
    assert "dispatch" in live
    backends = [{"url": "http://a"}, {"url": "http://b"}]
    s = Scheduler(config(backends), GatewayMetrics())
    assert s.pools.placement.shard is None
    s.configure(config(backends, dispatch="shard:1"))
    assert s.pools.placement.shard == 1


def test_locality_finds_the_backend_holding_the_longest_prefix_and_forgets_the_oldest():
    from fairserve.gateway.dispatch.locality import Locality

    near = Locality(blocks=4)
    a, b = B("http://a"), B("http://b")
    near.record("http://a", ["p1", "p2"])
    near.record("http://b", ["p1", "p2", "p3"])
    assert near.home(["p1", "p2", "p3", "x"], [a, b]) is b and near.home(["p1", "q"], [a, b]) is a  # tie: the first
    assert near.home(["z"], [a, b]) is a is near.home(["z", "y"], [b, a])  # unseen: the smallest record (a's, 2)
    assert near.home([], [a, b]) is None
    near.record("http://a", ["r1", "r2", "r3"])  # four kept: p1, the least recently sent, leaves a's record
    assert near.matched("http://a", ["p1"]) == 0 and near.matched("http://a", ["p2", "q"]) == 1
    assert near.matched("http://a", ["r1", "r2", "r3"]) == 3


def prefix_pass(rule: str) -> dict[str, str | None]:
    """Backends a and b, one request each. x's request (its prefix now at home on a) runs on a, y's bigger one on b.
    Queued then, in the policy's order: x's second (home a: full; counter 40), y's second (a new prefix, its home the
    backend with the smaller record, b; counter 400). When y's first ends, where each of the two went."""

    async def go() -> dict[str, str | None]:
        backends = [{"url": "http://a", "max_inflight_requests": 1}, {"url": "http://b", "max_inflight_requests": 1}]
        s = Scheduler(config(backends, dispatch=rule), GatewayMetrics())
        s.pools.locality.record("http://a", ["x1", "x2"])
        x1, y1 = s.new_ticket("x", Footprint(40, 5)), s.new_ticket("y", Footprint(400, 5))
        x1.prefix = ("x1", "x2")
        s.submit(x1)
        s.submit(y1)
        assert (x1.backend.url, y1.backend.url) == ("http://a", "http://b")
        x2, y2 = s.new_ticket("x", Footprint(40, 5)), s.new_ticket("y", Footprint(40, 5))
        x2.prefix, y2.prefix = ("x1", "x2", "x3"), ("y1",)
        s.submit(x2)
        s.submit(y2)
        s.close(y1, Ending("ok", 400, 0))
        return {t: (k.backend.url if k.admitted.done() else None) for t, k in (("x", x2), ("y", y2))}

    return asyncio.run(go())


def test_prefix_dispatch_lets_a_request_wait_for_its_prefix_within_delta():
    assert prefix_pass("prefix") == {"x": None, "y": "http://b"}  # x's waits for a, y's (within DELTA) goes home
    # negative controls: least_loaded sends x's to b; with a DELTA of 100 y (counter 400) may not overtake x (40)
    assert prefix_pass("least_loaded") == {"x": "http://b", "y": None}
    assert prefix_pass("prefix:100") == {"x": "http://b", "y": None}


def test_prefix_dispatch_is_refused_with_replicas():
    assert config(["http://a"], dispatch="prefix").placement().prefix_delta == 4096
    with pytest.raises(ValueError, match="dispatch: prefix works on one gateway"):
        config(["http://a"], dispatch="prefix", state="redis://127.0.0.1:6379/0")


def test_a_bodys_prompt_blocks_are_the_texts_a_backend_caches():
    from fairserve.api.prefix import prompt_text
    from fairserve.gateway.dispatch.locality import prompt_digests

    system = prompt_text(64, (("sys", 64),))  # four blocks of 16 tokens
    chat = [{"role": "system", "content": system}, {"role": "user", "content": "one question, then another"}]
    a = prompt_digests({"messages": chat}, True, 80)
    b = prompt_digests({"messages": [chat[0], {"role": "user", "content": "x" * 80}]}, True, 90)
    assert len(a) >= 4 and a[:4] == b[:4]
    ids = list(range(40))
    assert prompt_digests({"prompt": ids}, False, 40)[:2] == prompt_digests({"prompt": [ids + [1]]}, False, 41)[:2]
    assert prompt_digests({"prompt": 7}, False, 40) == ()
