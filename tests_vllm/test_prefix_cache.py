"""The simulator's prefix cache (sim/prefix_cache.py) against vLLM's own: the same requests, in the same order, on
the same pool and block size, find the same number of cached prompt tokens (vLLM's `num_cached_tokens`)."""

from __future__ import annotations

import random

from engine import Job, drive

from fairserve.sim.prefix_cache import PrefixCache, prompt_keys

BLOCK, POOL = 32, 12  # the "prefix" engine of engine.CONFIGS: 12 usable blocks of 32 tokens


def jobs(n: int, seed: int) -> list[Job]:
    """Requests over four shared prefixes (one of them the whole prompt of some) and some that share nothing. The
    output stays inside the prompt's last, partial block: vLLM caches full blocks of output too, the model does not
    (docs/workloads.md), so output never fills a block here."""
    rng = random.Random(seed)
    prefixes = {"sys-a": 96, "sys-b": 150, "doc": 200, "short": 40}
    out = []
    for i in range(n):
        pid = rng.choice([*prefixes, None])
        shared = prefixes[pid] if pid else 0
        prompt = shared + rng.randrange(1, 120)
        if pid == "short" and rng.random() < 0.3:
            prompt = shared  # the whole prompt is the prefix
        max_tokens = rng.randrange(1, BLOCK + 1 - prompt % BLOCK)  # the KV of the outputs fills no new block
        out.append(Job(f"p{seed}-{i}", None, prompt, max_tokens, prefix=(pid, shared) if pid else None))
    return out


def simulated_cached(jobs: list[Job]) -> dict[str, int]:
    """One request at a time through the model: admit (the prompt and the KV of its outputs), then release."""
    cache, cached = PrefixCache(POOL, BLOCK), {}
    for job in jobs:
        keys = prompt_keys(job.prompt, BLOCK, job.rid, (job.prefix,) if job.prefix else ())
        held = cache.admit(keys, job.prompt, extra_tokens=job.max_tokens - 1)
        assert held is not None, job
        cached[job.rid] = held.cached_tokens
        cache.release(held)
        cache.check()
    return cached


def test_cached_tokens_per_request_equal_vllms(engines):
    llm = engines.get("prefix")
    work = jobs(60, seed=3)
    run = drive(llm, work)
    assert list(run.admitted) == [j.rid for j in work]  # one at a time, in order
    want = simulated_cached(work)
    assert run.cached == want
    # the pool is large enough to hit (26 of the 60 requests, 27% of the prompt tokens) and small enough to evict
    # (31 of the 52 that share a prefix found less of it than a pool without eviction would keep)
    assert sum(1 for v in want.values() if v) >= 20 and sum(want.values()) > 0.2 * sum(j.prompt for j in work)
    evicted = sum(1 for j in work if j.prefix and want[j.rid] < (min(j.prefix[1], j.prompt - 1) // BLOCK) * BLOCK)
    assert evicted >= 20
