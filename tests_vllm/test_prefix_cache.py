"""The simulator's prefix cache against vLLM's own (automatic prefix caching in vLLM's CPU build): for the same
requests, in the same order, with the same block size and pool, every request's cached prompt tokens in the
simulator (`SimResult.cached_tokens`) equal vLLM's `num_cached_tokens`. The requests share system prompts (some
chained: a longer prompt that starts with a shorter one) and run one after another, in a pool too small to keep
every prefix, so eviction decides what stays cached."""

from __future__ import annotations

import random
import zlib

from fairserve.core import Ledger, make_policy
from fairserve.sim import EngineConfig, SimEngine
from fairserve.sim.latency import ConstantLatency
from fairserve.workloads import Arrival

BLOCK = 32  # vLLM's CPU build needs a multiple of 32
BLOCKS = 24  # vLLM's pool; one is its null block
PREFIXES = {"s1": 200, "s2": 150, "s3": 90, "s1/doc": 130}  # "s1/doc" follows "s1": a chained, longer prefix


def segment_tokens(name: str, n: int) -> list[int]:
    """The tokens of a prefix segment: the same for every request that names it."""
    rng = random.Random(zlib.crc32(name.encode()))
    return [rng.randrange(256) for _ in range(n)]


def requests(seed: int, n: int) -> list[tuple[tuple[tuple[str, int], ...], list[int], int]]:
    """(prefix segments, prompt token ids, output tokens) for `n` requests; no prompt is a whole number of blocks
    (vLLM then recomputes its last block as a second cached copy, which the simulator does not keep)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        first = rng.choice(["s1", "s2", "s3", None])
        segments: tuple[tuple[str, int], ...] = ()
        if first is not None:
            segments = ((first, PREFIXES[first]),)
            if first == "s1" and rng.random() < 0.4:
                segments += (("s1/doc", PREFIXES["s1/doc"]),)
        ids = [t for name, k in segments for t in segment_tokens(name, k)]
        ids += [rng.randrange(256) for _ in range(rng.randrange(1, 70))]
        output = rng.randrange(2, 60)
        if len(ids) % BLOCK and (len(ids) + output - 1) < (BLOCKS - 1) * BLOCK:
            out.append((segments, ids, output))
    return out


def simulated(reqs) -> list[int]:
    arrivals = [Arrival(1000.0 * i, "c", len(ids), out, segs) for i, (segs, ids, out) in enumerate(reqs)]
    cfg = EngineConfig(kv_tokens=(BLOCKS - 1) * BLOCK, mode="paged", prefix_cache=True, block_tokens=BLOCK)
    result = SimEngine(Ledger(make_policy("fcfs")), ConstantLatency(decode_s=0.01), cfg).run(arrivals)
    assert all(r.status == "finished" for r in result.records)
    assert result.cached_tokens is not None
    return result.cached_tokens


def test_cached_tokens_per_request_equal_vllms(engines):
    from vllm import SamplingParams

    llm = engines.get("prefix-cache")
    llm.reset_prefix_cache()
    reqs = requests(1, 50)
    theirs = []
    for _, ids, output in reqs:  # one at a time: the order is the same on both sides
        params = SamplingParams(max_tokens=output, ignore_eos=True, temperature=0.0)
        (out,) = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        theirs.append(out.num_cached_tokens)
    ours = simulated(reqs)
    assert ours == theirs
    hits = [c for c in theirs if c]
    assert len(hits) > len(reqs) // 3 and any(c > PREFIXES["s1"] for c in hits)  # chained prefixes hit as a whole
    seen, evicted = set(), 0
    for (segs, _, _), cached in zip(reqs, ours, strict=True):
        if segs and segs[0][0] in seen and cached < segs[0][1] // BLOCK * BLOCK:
            evicted += 1  # its system prompt ran before and was evicted since: eviction is compared too
        seen.update(name for name, _ in segs)
    assert evicted
