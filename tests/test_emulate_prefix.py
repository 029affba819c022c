"""The emulator's prefix cache (`fairserve emulate --prefix-cache`): a prompt's blocks hashed from what it receives
(api/prefix.py), the simulator's cache keyed by them, and vLLM's prefix-cache counters in /metrics."""

from __future__ import annotations

import random

import pytest

from fairserve.api.prefix import block_digests, prefix_segments
from fairserve.api.tokens import CHARS_PER_TOKEN, estimate_tokens
from fairserve.emulate import EmulatorConfig
from fairserve.emulate.driver import Emulator
from fairserve.sim import SimOptions, simulate
from fairserve.workloads import Arrival, Workload

pytestmark = pytest.mark.unit

B = 16  # tokens per block
CHARS = B * CHARS_PER_TOKEN


def text(seed: str, blocks: int) -> str:
    """`blocks` whole blocks of text, different for every seed."""
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghij ") for _ in range(blocks * CHARS))


def test_prompts_share_the_digests_of_the_blocks_they_share_from_their_start():
    system = text("sys", 4)
    a, b = system + text("a", 3), system + text("b", 2)
    da, db = block_digests(a, estimate_tokens(a), B), block_digests(b, estimate_tokens(b), B)
    assert (len(da), len(db)) == (7, 6)
    assert da[:4] == db[:4] and not set(da[4:]) & set(db[4:])
    # NOTE: chained: the same fifth block after another start is another block
    other = block_digests(text("x", 4) + a[4 * CHARS :], estimate_tokens(a), B)
    assert not set(other) & set(da)
    assert len(block_digests(a, 5 * B + 3, B)) == 5  # no more blocks than the token count holds whole
    ids = list(range(100))
    assert block_digests(ids, 100, B)[:6] == block_digests([*ids, 7, 7], 102, B)[:6]
    assert prefix_segments(a, estimate_tokens(a), B) == tuple((d, B) for d in da)


def test_the_emulators_cache_equals_the_simulators_on_the_same_requests():
    """Eight tenants with private 512-token system prompts and their own questions, one request at a time in a
    shuffled order, a pool that holds about half the prompts: the emulator, hashing the text it receives, finds in
    its cache exactly the tokens the simulator finds for the same requests declared with prefix segments."""
    tenants = [f"t{i}" for i in range(8)]
    rng = random.Random(0)
    order = [t for _ in range(6) for t in rng.sample(tenants, len(tenants))]
    system = {t: text(f"sys-{t}", 32) for t in tenants}  # 512 tokens
    prompts = [system[t] + text(f"q{i}", 4) for i, t in enumerate(order)]
    config = dict(profile="llama-2-7b@a10g", kv_tokens=2_600)
    arrivals = [
        Arrival(2.0 * i, t, estimate_tokens(p), 8, prefix=((f"sys-{t}", 32 * B),))
        for i, (t, p) in enumerate(zip(order, prompts, strict=True))
    ]
    w = Workload("prefix", arrivals, 2.0 * len(order), kv_tokens=config["kv_tokens"])
    opts = SimOptions(
        latency=config["profile"], mode="paged", prefix_cache=True, block_tokens=B, drain=True, policy="fcfs"
    )
    want = simulate(w, opts).cached_tokens
    em = Emulator(EmulatorConfig(engine_mode="paged", prefix_cache=True, block_tokens=B, **config))
    jobs = []
    for a, p in zip(arrivals, prompts, strict=True):
        em.sim_now = lambda t=a.arrival_s: t  # type: ignore[method-assign]  # NOTE: the test's clock
        em.engine.advance_to(a.arrival_s)
        jobs.append(em.submit(f"r{len(jobs)}", a.client, a.prompt_tokens, a.output_tokens, p))
    em.engine.advance_to(1e9)
    got = [job.req.cached_tokens for job in jobs]
    assert got == want
    assert 0 < sum(1 for g in got if g) < len(got)  # NOTE: hits and misses: the pool holds about half the prompts
    # vLLM's counters, in tokens, as the driver hands each job its tokens: every prompt looked up once, the hits
    for job in jobs:
        em._hand(job, job.req.generated)
    assert em.prefix_queries == sum(a.prompt_tokens for a in arrivals) and em.prefix_hits == sum(got)


def test_the_prefix_cache_needs_the_paged_engine_and_whole_blocks():
    with pytest.raises(ValueError, match="--prefix-cache needs --engine-mode paged"):
        EmulatorConfig(prefix_cache=True)
    with pytest.raises(ValueError, match="--block-tokens must be a whole number >= 1"):
        EmulatorConfig(engine_mode="paged", prefix_cache=True, block_tokens=0)


def test_a_workloads_declared_prefixes_become_text_that_shares_exactly_them():
    from fairserve.api.prefix import prompt_text
    from fairserve.bench.runner import request_body

    seg = (("org", 32), ("org/sys-a", 48))
    a, b = prompt_text(130, seg, "r1"), prompt_text(100, seg[:1] + (("org/sys-b", 48),), "r2")
    assert (estimate_tokens(a), estimate_tokens(b)) == (130, 100)
    da, db = block_digests(a, 130, B), block_digests(b, 100, B)
    assert da[:2] == db[:2] and not set(da[2:]) & set(db[2:])  # the 32 shared tokens: two blocks, no more
    assert prompt_text(130, seg, "r1") == a and prompt_text(130, seg, "r3")[: 80 * CHARS_PER_TOKEN] == a[: 80 * 4]
    arrival = Arrival(0.0, "t", 130, 5, prefix=seg)
    assert request_body(arrival, "chat", "m")["messages"][0]["content"] == prompt_text(130, seg, ("t", 0.0))
