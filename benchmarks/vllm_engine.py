"""VTC inside a real vLLM engine (vLLM's CPU build) vs vLLM's default scheduler, same model, same workload.

Workload: two clients, one sending three times as many requests as the other, all added before the first step (both
backlogged from the start); every request has the same prompt and output length (ignore_eos), so both schedulers do
the same work. Each engine is built once, with the same settings, in its own worker process (vLLM binds a process's
threads when it builds an engine: two engines in one process would not run alike), with vLLM's engine core in that
process; rounds alternate default and VTC, one engine running at a time. Reported per scheduler (medians over
rounds): output tokens/s, engine steps, and the scheduler's time per engine step (`schedule` + `update_from_output`,
where fairserve's work happens). The model is the small random Llama of the tests (scripts/vllm_cpu_model.py): its
steps are short, so the scheduler's share of a step is larger than with a real model.

`--policies vtc,vtc:preempt=100` runs each fairserve policy (its engine options included) as its own engine beside
the default, so the preemption options are measured on and off in one run.

Run (the venv of scripts/vllm_cpu_env.sh):
    PYTHONPATH=src $(scripts/vllm_cpu_env.sh) benchmarks/vllm_engine.py [--requests 64] [--rounds 5] [--policies P,P]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
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

TARGET = 0.98  # VTC tokens/s ÷ default tokens/s


def build(model: Path, vtc: bool, max_num_seqs: int) -> Any:
    from vllm import LLM

    args: dict[str, Any] = dict(
        max_num_seqs=max_num_seqs,
        max_model_len=1024,
        enforce_eager=True,
        dtype="float32",
        seed=0,
        enable_prefix_caching=False,
    )
    if vtc:
        args["scheduler_cls"] = SCHEDULER_PATH
    return LLM(str(model), **args)


def timed(sched: Any) -> list[float]:
    """Time the scheduler's `schedule` and `update_from_output` (instance attributes over the class methods)."""
    spent: list[float] = []
    for name in ("schedule", "update_from_output"):
        inner = getattr(sched, name)

        def wrapper(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - t0)

        setattr(sched, name, wrapper)
    return spent


def one_round(llm: Any, spent: list[float], tag: str, requests: int, prompt: int, output: int) -> dict[str, float]:
    from vllm import SamplingParams

    engine = llm.llm_engine
    light = max(1, requests // 4)
    clients = ["heavy"] * (requests - light) + ["light"] * light
    for i, client in enumerate(clients):
        params = SamplingParams(
            max_tokens=output, ignore_eos=True, temperature=0.0, extra_args={CLIENT_ARG: f"{tag}-{client}"}
        )
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": [(i * 7 + j) % 256 for j in range(prompt)]}, params)
    spent.clear()
    steps = tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            if out.finished:
                tokens += len(out.outputs[0].token_ids)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert tokens == requests * output, tokens
    return {
        "tokens_per_s": tokens / wall,
        "tokens_per_cpu_s": tokens / cpu,
        "steps": steps,
        "sched_us_per_step": 1e6 * sum(spent) / steps,
    }


def worker(policy: str | None, max_num_seqs: int, conn: Any) -> None:
    """One engine (`policy`: fairserve's FAIRSERVE_POLICY, None: vLLM's default scheduler); runs the rounds the
    parent sends (tag, requests, prompt, output) until it sends None."""
    if policy is not None:
        os.environ["FAIRSERVE_POLICY"] = policy
    llm = build(vllm_cpu_model.build(vllm_cpu_model.default_dir()), policy is not None, max_num_seqs)
    spent = timed(llm.llm_engine.engine_core.engine_core.scheduler)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        conn.send(one_round(llm, spent, *job))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per request")
    ap.add_argument("--output", type=int, default=32, help="output tokens per request")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--policies",
        default="vtc",
        metavar="P[,P...]",
        help="fairserve policies to run beside vLLM's default scheduler, each its own engine (default: vtc; e.g. "
        "vtc,vtc:preempt=100,vtc:preempt-priority=1: the preemption options on and off)",
    )
    ap.add_argument("--vtc-first", action="store_true", help="build the fairserve engines' workers first")
    args = ap.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]

    vllm_cpu_model.build(vllm_cpu_model.default_dir())
    import vllm

    ctx = mp.get_context("spawn")
    names = ["default", *policies]
    conns, procs = {}, []
    for name in [*policies, "default"] if args.vtc_first else names:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(None if name == "default" else name, args.max_num_seqs, child))
        proc.daemon = True
        proc.start()
        assert parent.recv() == "ready"  # built one after the other
        conns[name] = parent
        procs.append(proc)
    try:
        for name, conn in conns.items():  # warm-up
            conn.send((f"warm-{name}", 8, args.prompt, 4))
            conn.recv()
        results: dict[str, list[dict[str, float]]] = {name: [] for name in conns}
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                conns[name].send((f"r{r}-{name}", args.requests, args.prompt, args.output))
                results[name].append(conns[name].recv())
    finally:
        for conn in conns.values():
            conn.send(None)
        for proc in procs:
            proc.join(60)

    med = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in results.items()}
    print(
        f"vLLM {vllm.__version__} (CPU), {args.requests} requests ({args.requests - max(1, args.requests // 4)} "
        f"heavy + {max(1, args.requests // 4)} light) of {args.prompt}+{args.output} tokens, max_num_seqs "
        f"{args.max_num_seqs}, {args.rounds} interleaved rounds, medians"
    )
    width = max(len(n) for n in names) + 2
    print(f"{'scheduler':<{width}} {'output tok/s':>13} {'tok/CPU-s':>10} {'steps':>7} {'scheduler µs/step':>18}")
    for name in names:
        m = med[name]
        print(
            f"{name:<{width}} {m['tokens_per_s']:>13,.0f} {m['tokens_per_cpu_s']:>10,.0f} {m['steps']:>7.0f} "
            f"{m['sched_us_per_step']:>18,.0f}"
        )
    for name in policies:
        pairs = zip(results[name], results["default"], strict=False)
        ratios = [v["tokens_per_s"] / d["tokens_per_s"] for v, d in pairs]
        ratio = statistics.median(ratios)
        print(
            f"{name} / default tokens/s: median of per-round ratios {ratio:.3f} (rounds: "
            f"{', '.join(f'{x:.3f}' for x in ratios)}); goal >= {TARGET}: {'met' if ratio >= TARGET else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
