"""Driving a real in-process vLLM engine step by step: who finished at which engine step, what was charged."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairserve.engines.vllm_scheduler import CLIENT_ARG, SCHEDULER_PATH

W_P, W_Q = 1.0, 2.0  # FAIRSERVE_WP / FAIRSERVE_WQ defaults


@dataclass(frozen=True)
class Job:
    rid: str
    client: str
    prompt: int  # prompt tokens
    max_tokens: int


@dataclass
class Run:
    finished_at: dict[str, int] = field(default_factory=dict)  # request id -> engine step it finished in
    outputs: dict[str, int] = field(default_factory=dict)  # request id -> output tokens produced
    steps: int = 0
    preemptions: int = 0
    service_at: list[dict[str, float]] = field(default_factory=list)  # each client's service after each step


# engine settings: small batches, so requests queue; name -> (VTC?, extra LLM arguments, environment)
CONFIGS: dict[str, tuple[bool, dict[str, Any], dict[str, str]]] = {
    "vtc": (True, {}, {"FAIRSERVE_WEIGHTS": "w2=2"}),
    "default": (False, {}, {}),
    # 7 usable blocks of 32 tokens: a few long requests cannot all stay resident, vLLM preempts
    "tiny-kv": (True, {"num_gpu_blocks_override": 8, "block_size": 32, "max_model_len": 128}, {}),
}


class Engines:
    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self._llms: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        if name not in self._llms:
            from vllm import LLM

            vtc, extra, env = CONFIGS[name]
            args: dict[str, Any] = (
                dict(
                    max_num_seqs=4,
                    max_model_len=512,
                    enforce_eager=True,
                    dtype="float32",
                    seed=0,
                    enable_prefix_caching=False,
                )
                | extra
            )
            if vtc:
                args["scheduler_cls"] = SCHEDULER_PATH
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)  # the scheduler reads FAIRSERVE_* when vLLM constructs it
            try:
                self._llms[name] = LLM(str(self.model_dir), **args)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        return self._llms[name]

    def close(self) -> None:
        self._llms.clear()


def scheduler_of(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core.scheduler


def prompt_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def drive(llm: Any, jobs: Iterable[Job], abort: dict[str, int] | None = None, max_steps: int = 5000) -> Run:
    """Add every job (in order) to the engine, then step it until all are done. `abort`: request id -> the step
    after which it is aborted (as vLLM does when a client goes away)."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    sched = scheduler_of(llm)
    run = Run()
    for i, job in enumerate(jobs):
        params = SamplingParams(
            max_tokens=job.max_tokens, ignore_eos=True, temperature=0.0, extra_args={CLIENT_ARG: job.client}
        )
        engine.add_request(job.rid, {"prompt_token_ids": prompt_ids(job.prompt, i)}, params)
    abort = dict(abort or {})
    preempted: dict[str, int] = {}
    produced: dict[str, int] = {}  # output tokens so far (vLLM's engine core keys requests by an internal id)

    def abort_due() -> None:
        for rid, step in list(abort.items()):
            if step == run.steps:
                run.outputs[rid] = produced.get(rid, 0)
                engine.abort_request([rid])
                del abort[rid]

    abort_due()  # step 0: before the first step, still waiting
    while engine.has_unfinished_requests():
        run.steps += 1
        if run.steps > max_steps:
            raise AssertionError(f"the engine did not finish in {max_steps} steps")
        for out in engine.step():
            produced[out.request_id] = len(out.outputs[0].token_ids)
            if out.finished and out.request_id not in run.outputs:
                run.finished_at[out.request_id] = run.steps
                run.outputs[out.request_id] = len(out.outputs[0].token_ids)
        for rid, req in sched.requests.items():
            preempted[rid] = max(preempted.get(rid, 0), req.num_preemptions)
        abort_due()
        if hasattr(sched, "fairserve"):
            run.service_at.append(dict(sched.fairserve.ledger.service))
    run.preemptions = sum(preempted.values())
    return run


def expected_service(jobs: Iterable[Job], outputs: dict[str, int]) -> dict[str, float]:
    total: dict[str, float] = {}
    for job in jobs:
        total[job.client] = total.get(job.client, 0.0) + W_P * job.prompt + W_Q * outputs[job.rid]
    return total
