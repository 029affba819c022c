"""DLPM against VTC inside a real vLLM engine (vLLM's CPU build) with vLLM's prefix cache on.

Workload: `--tenants` tenants, each with a private system prompt of `--system` tokens that every one of its
`--each` requests starts with (then `--own` tokens of its own), all added before the first step (every tenant
backlogged from the start), queued tenant after tenant in turn. The pool (`--pool-blocks` blocks of 32 tokens) holds
about half of the system prompts. Each policy's engine is built once in its own worker process (vLLM binds a
process's threads when it builds an engine) with vLLM's engine core in that process; rounds alternate the order of
the engines, one running at a time, and each round starts with an empty prefix cache.

Reported per policy (medians over rounds): output tokens/s (wall), vLLM's own prefix-cache hit rate (its
`num_cached_tokens` over the prompt tokens), prompt tokens computed, engine steps, the largest difference in service
between two tenants while both are backlogged against DLPM's bound 2·(Q + w_p·L_in + w_q·M) (M the pool's tokens), and
the worst tenant's median time to first token.

Run (the venv of scripts/vllm_cpu_env.sh):
    PYTHONPATH=src $(scripts/vllm_cpu_env.sh) benchmarks/vllm_dlpm.py [--rounds 3] [--policies vtc,dlpm:4000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import vllm_cpu_model  # noqa: E402

from fairserve.engines.vllm_scheduler import CLIENT_ARG, SCHEDULER_PATH  # noqa: E402

BLOCK = 32


def build(model: Path, policy: str, max_num_seqs: int, pool_blocks: int) -> Any:
    from vllm import LLM

    os.environ["FAIRSERVE_POLICY"] = policy
    return LLM(
        str(model),
        max_num_seqs=max_num_seqs,
        max_model_len=4096,
        enforce_eager=True,
        dtype="float32",
        seed=0,
        enable_prefix_caching=True,
        block_size=BLOCK,
        num_gpu_blocks_override=pool_blocks,
        scheduler_cls=SCHEDULER_PATH,
    )


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def one_round(llm: Any, tag: str, a: argparse.Namespace) -> dict[str, float]:
    from vllm import SamplingParams

    engine = llm.llm_engine
    sched = engine.engine_core.engine_core.scheduler
    llm.reset_prefix_cache()
    owner: dict[str, str] = {}
    for j in range(a.each):
        for k in range(a.tenants):
            rid, tenant = f"{tag}-t{k}-{j}", f"{tag}-t{k}"
            params = SamplingParams(
                max_tokens=a.output, ignore_eos=True, temperature=0.0, extra_args={CLIENT_ARG: tenant}
            )
            prompt = tokens(a.system, 1000 + k) + tokens(a.own, 7919 * k + j + 1)
            engine.add_request(rid, {"prompt_token_ids": prompt}, params)
            owner[rid] = tenant
    steps = out_tokens = 0
    cached: dict[str, int] = {}
    first: dict[str, float] = {}
    gap = 0.0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            rid = out.request_id
            if out.num_cached_tokens:
                cached[rid] = out.num_cached_tokens
            if rid not in first and out.outputs[0].token_ids:
                first[rid] = time.perf_counter() - t0
            if out.finished:
                out_tokens += len(out.outputs[0].token_ids)
        view = sched.fairserve.engine_queue.view().tenants
        backlogged = [v.service for t, v in view.items() if t.startswith(tag + "-") and v.queued]
        if len(backlogged) > 1:  # NOTE: every pair of tenants both backlogged at this step
            gap = max(gap, max(backlogged) - min(backlogged))
    wall = time.perf_counter() - t0
    n = a.tenants * a.each
    assert out_tokens == n * a.output, out_tokens
    prompt = a.system + a.own
    ttft = {t: statistics.median(s for r, s in first.items() if owner[r] == t) for t in set(owner.values())}
    return {
        "tokens_per_s": out_tokens / wall,
        "hit_rate": sum(cached.values()) / (n * prompt),
        "computed": n * prompt - sum(cached.values()),
        "steps": steps,
        "gap": gap,
        "worst_ttft_s": max(ttft.values()),
    }


def worker(policy: str, a: argparse.Namespace, conn: Any) -> None:
    llm = build(vllm_cpu_model.build(vllm_cpu_model.default_dir()), policy, a.max_num_seqs, a.pool_blocks)
    conn.send("ready")
    while (tag := conn.recv()) is not None:
        conn.send(one_round(llm, tag, a))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--each", type=int, default=8, help="requests per tenant")
    ap.add_argument("--system", type=int, default=1000, help="tokens of each tenant's system prompt")
    ap.add_argument("--own", type=int, default=40, help="tokens of each request's own part of the prompt")
    ap.add_argument("--output", type=int, default=16, help="output tokens per request")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--pool-blocks", type=int, default=160, help="the KV pool, in blocks of 32 tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--policies", default="vtc,dlpm:4000", metavar="P[,P...]")
    a = ap.parse_args()
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]

    vllm_cpu_model.build(vllm_cpu_model.default_dir())
    import vllm

    ctx = mp.get_context("spawn")
    conns, procs = {}, []
    for name in policies:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(name, a, child))
        proc.daemon = True
        proc.start()
        assert parent.recv() == "ready"
        conns[name] = parent
        procs.append(proc)
    try:
        results: dict[str, list[dict[str, float]]] = {name: [] for name in policies}
        for r in range(a.rounds):
            for name in policies if r % 2 == 0 else policies[::-1]:
                conns[name].send(f"r{r}")
                results[name].append(conns[name].recv())
    finally:
        for conn in conns.values():
            conn.send(None)
        for proc in procs:
            proc.join(60)

    pool = a.pool_blocks * BLOCK
    print(
        f"vLLM {vllm.__version__} (CPU), {a.tenants} tenants x {a.each} requests of {a.system}-token system prompt + "
        f"{a.own} + {a.output} output tokens, pool {pool} tokens ({pool / a.system:.1f} system prompts), "
        f"max_num_seqs {a.max_num_seqs}, {a.rounds} interleaved rounds, medians"
    )
    print(
        f"{'policy':<16} {'output tok/s':>13} {'hit rate':>9} {'computed':>9} {'steps':>6} {'max gap':>8} "
        f"{'bound':>8} {'worst TTFT s':>13}"
    )
    for name in policies:
        m = {k: statistics.median(x[k] for x in results[name]) for k in results[name][0]}
        q = float(name.partition(":")[2] or "nan")
        bound = (
            2 * (q + (a.system + a.own) + 2 * pool) if name.startswith("dlpm") else 2 * max(a.system + a.own, 2 * pool)
        )
        print(
            f"{name:<16} {m['tokens_per_s']:>13,.0f} {m['hit_rate']:>9.3f} {m['computed']:>9,.0f} {m['steps']:>6.0f} "
            f"{m['gap']:>8,.0f} {bound:>8,.0f} {m['worst_ttft_s']:>13.2f}"
        )
    base = policies[0]
    for name in policies[1:]:
        ratios = [x["tokens_per_s"] / b["tokens_per_s"] for x, b in zip(results[name], results[base], strict=True)]
        print(f"{name} / {base} tokens/s: median of per-round ratios {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
