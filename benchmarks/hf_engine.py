"""VTC inside transformers' continuous batching vs transformers' own FIFO scheduler, same model, same workload.

Workload: two clients, one sending three times as many requests, all submitted at once (both backlogged from the
start); every request has the same prompt and output length (ignore_eos), so both schedulers do the same work.
Reported per scheduler: output tokens/s of the whole run, wall seconds, output tokens per CPU second of this process
(steadier than wall time on a shared machine), and the scheduler's share of step time (time inside `schedule_batch`
/ wall time of the run). Rounds alternate FIFO and VTC; medians over rounds.

Run: .venv/bin/python benchmarks/hf_engine.py [--model small-random] [--requests 48] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time

import torch

from fairserve.core import make_policy
from fairserve.engines.hf_engine import EngineSizing, HFEngine
from fairserve.engines.hf_models import load_model

TARGET = 0.98  # VTC tokens/s ÷ FIFO tokens/s


def timed_scheduler(engine: HFEngine) -> list[float]:
    """Wrap the running scheduler's schedule_batch; returns the list its durations are appended to."""
    scheduler = engine.manager.batch_processor.scheduler
    inner, spent = scheduler.schedule_batch, []

    def schedule_batch(token_budget: int, cache_budget: int):
        t0 = time.perf_counter()
        try:
            return inner(token_budget, cache_budget)
        finally:
            spent.append(time.perf_counter() - t0)

    scheduler.schedule_batch = schedule_batch
    return spent


def one_run(model, tokenizer, policy: str, args: argparse.Namespace) -> dict[str, float]:
    sizing = EngineSizing(
        num_blocks=args.num_blocks,
        page_size=args.page_size,
        max_batch_tokens=args.max_batch_tokens,
        max_requests_per_batch=args.max_requests_per_batch,
    )
    engine = HFEngine(model, tokenizer, None if policy == "fifo" else make_policy(policy), sizing)
    engine.start()
    try:
        spent = timed_scheduler(engine)
        heavy = args.requests * 3 // 4
        clients = [
            c
            for _, c in sorted(
                [((k + 1) / heavy, "heavy") for k in range(heavy)]
                + [((k + 1) / (args.requests - heavy), "light") for k in range(args.requests - heavy)]
            )
        ]

        async def request(i: int, client: str) -> int:
            out = None
            async for out in engine.generate(  # noqa: B007  # the last item is the result
                client, [3 + (i * 7 + j) % 250 for j in range(args.prompt)], args.output, ignore_eos=True
            ):
                pass
            return len(out.generated_tokens)

        async def main() -> int:
            return sum(await asyncio.gather(*(request(i, c) for i, c in enumerate(clients))))

        t0, c0 = time.perf_counter(), time.process_time()
        tokens = asyncio.run(main())
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        engine.stop()
    return {
        "tokens_per_s": tokens / wall,
        "wall_s": wall,
        "tokens_per_cpu_s": tokens / cpu,
        "sched_share": sum(spent) / wall,
        "sched_ms_per_step": 1e3 * sum(spent) / max(1, len(spent)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="small-random")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--output", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--policy", default="vtc")
    p.add_argument("--num-blocks", type=int, default=256)
    p.add_argument("--page-size", type=int, default=32)
    p.add_argument("--max-batch-tokens", type=int, default=512)
    p.add_argument("--max-requests-per-batch", type=int, default=32)
    p.add_argument("--quick", action="store_true", help="tiny-random, 24 requests, 2 rounds")
    args = p.parse_args()
    if args.quick:
        args.model, args.requests, args.rounds = "tiny-random", 24, 2
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
    model, tokenizer = load_model(args.model)
    runs: dict[str, list[dict[str, float]]] = {"fifo": [], args.policy: []}
    one_run(model, tokenizer, "fifo", args)  # warm-up, not reported
    for _ in range(args.rounds):
        for policy in runs:
            runs[policy].append(one_run(model, tokenizer, policy, args))
    med = {pol: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for pol, rs in runs.items()}
    print(
        f"{args.model}, torch {torch.__version__} on {torch.get_num_threads()} threads; {args.requests} requests "
        f"(3:1 heavy:light) × {args.prompt} prompt + {args.output} output tokens; KV pool "
        f"{args.num_blocks * args.page_size} tokens; median of {args.rounds} alternating rounds\n"
    )
    print(
        "| scheduler | output tokens/s | wall s | tokens per CPU s | scheduler share of step time | scheduler ms/step |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    names = {"fifo": "transformers FIFO"}
    for pol, m in med.items():
        print(
            f"| {names.get(pol, 'fairserve ' + pol)} | {m['tokens_per_s']:.1f} | {m['wall_s']:.2f} | "
            f"{m['tokens_per_cpu_s']:.1f} | "
            f"{100 * m['sched_share']:.2f}% | {m['sched_ms_per_step']:.3f} |"
        )
    ratio = med[args.policy]["tokens_per_s"] / med["fifo"]["tokens_per_s"]
    per_round = [v["tokens_per_s"] / f["tokens_per_s"] for v, f in zip(runs[args.policy], runs["fifo"], strict=False)]
    cpu_ratio = med[args.policy]["tokens_per_cpu_s"] / med["fifo"]["tokens_per_cpu_s"]
    print(
        f"\n{args.policy} ÷ FIFO tokens/s: {ratio:.3f} (per round: {', '.join(f'{r:.3f}' for r in per_round)}); "
        f"per CPU second: {cpu_ratio:.3f}; target ≥ {TARGET}: {'met' if min(ratio, cpu_ratio) >= TARGET else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
