"""A high-priority request behind a full batch of low-priority work, inside vLLM's CPU build: vLLM's own priority
scheduling against fairserve's plugin without and with priority that preempts (`vtc:preempt-priority=1`).

The case of vLLM issue #24365 ("high priority not work"): 30 batch requests at priority 10 fill the engine
(`max_num_seqs` 8, long outputs); at step 20 one request at priority 0 arrives. Reported per engine (medians over
rounds): the urgent request's engine steps and seconds from its arrival to its first token and to its finish, beside
the same request alone on the engine. Each engine runs in its own worker process (vLLM binds a process's threads
when it builds an engine); the model is the small random Llama of the vLLM tests (scripts/vllm_cpu_model.py).

Run (the venv of scripts/vllm_cpu_env.sh):
    PYTHONPATH=src $(scripts/vllm_cpu_env.sh) benchmarks/vllm_priority.py [--rounds 3] [--batch 30]
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

# name -> (fairserve's scheduler?, FAIRSERVE_POLICY)
ENGINES: dict[str, tuple[bool, str]] = {
    "vLLM, --scheduling-policy priority": (False, ""),
    "fairserve (vtc)": (True, "vtc"),
    "fairserve (vtc:preempt-priority=1)": (True, "vtc:preempt-priority=1"),
}
ARRIVES_AT = 20  # the urgent request is added before this engine step


def build(vtc: bool, policy: str, max_num_seqs: int) -> Any:
    if vtc:
        os.environ["FAIRSERVE_POLICY"] = policy
        os.environ["FAIRSERVE_ALLOWED_PRIORITIES"] = "batch=0|10,urgent=0|10"
    from vllm import LLM

    args: dict[str, Any] = dict(
        max_num_seqs=max_num_seqs,
        max_model_len=1024,
        enforce_eager=True,
        dtype="float32",
        seed=0,
        enable_prefix_caching=False,
        scheduling_policy="priority",
    )
    if vtc:
        args["scheduler_cls"] = SCHEDULER_PATH
    return LLM(str(vllm_cpu_model.build(vllm_cpu_model.default_dir())), **args)


def one_round(llm: Any, tag: str, batch: int, prompt: int, output: int, alone: bool) -> dict[str, float]:
    from vllm import SamplingParams

    engine = llm.llm_engine

    def add(rid: str, client: str, priority: int, max_tokens: int, seed: int) -> None:
        params = SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, temperature=0.0, extra_args={CLIENT_ARG: client}
        )
        tokens = [(seed * 7 + j) % 256 for j in range(prompt)]
        engine.add_request(rid, {"prompt_token_ids": tokens}, params, priority=priority)

    if not alone:
        for i in range(batch):
            add(f"{tag}-b{i}", "batch", 10, output, i)
    urgent = f"{tag}-urgent"
    step, first, done = 0, None, None
    added_at = t_added = 0.0
    while True:
        if step == (0 if alone else ARRIVES_AT):
            add(urgent, "urgent", 0, 32, 999)
            added_at, t_added = step, time.perf_counter()
        if not engine.has_unfinished_requests():
            break
        step += 1
        for out in engine.step():
            if out.request_id == urgent:
                if first is None and out.outputs[0].token_ids:
                    first = (step - added_at, time.perf_counter() - t_added)
                if out.finished:
                    done = (step - added_at, time.perf_counter() - t_added)
    assert first is not None and done is not None
    return {"first_steps": first[0], "first_s": first[1], "done_steps": done[0], "done_s": done[1]}


def worker(name: str, max_num_seqs: int, conn: Any) -> None:
    vtc, policy = ENGINES[name]
    llm = build(vtc, policy, max_num_seqs)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        conn.send(one_round(llm, *job))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=30, help="low-priority requests (default: 30)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--output", type=int, default=128, help="output tokens of a batch request (default: 128)")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for name in ENGINES:  # NOTE: one engine at a time: each has the machine to itself
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(name, a.max_num_seqs, child))
        proc.start()
        assert parent.recv() == "ready"
        results[name] = {"behind the batch": [], "alone": []}
        for r in range(a.rounds):
            for case, alone in (("alone", True), ("behind the batch", False)):
                parent.send((f"r{r}-{case[:2]}", a.batch, a.prompt, a.output, alone))
                results[name][case].append(parent.recv())
        parent.send(None)
        proc.join()
    print(
        f"{a.batch} requests at priority 10 ({a.prompt} + {a.output} tokens), max_num_seqs {a.max_num_seqs}; one at "
        f"priority 0 ({a.prompt} + 32) arrives at step {ARRIVES_AT}; medians of {a.rounds} rounds\n"
    )
    print("| engine | case | steps to first token | s to first token | steps to finish | s to finish |")
    print("|---|---|---:|---:|---:|---:|")
    for name, cases in results.items():
        for case in ("alone", "behind the batch"):
            med = {k: statistics.median(x[k] for x in cases[case]) for k in cases[case][0]}
            print(
                f"| {name} | {case} | {med['first_steps']:.0f} | {med['first_s']:.2f} | {med['done_steps']:.0f} | "
                f"{med['done_s']:.2f} |"
            )


if __name__ == "__main__":
    main()
