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
LORA: dict[str, Any] = {"enable_lora": True, "max_loras": 1, "max_lora_rank": 8}
PREFIX_ENGINE: dict[str, Any] = {"enable_prefix_caching": True, "block_size": 32, "num_gpu_blocks_override": 24}
# test_vllm_mode.py: steps of at most 64 tokens, 9 usable blocks of 32 tokens
STEPS_ENGINE: dict[str, Any] = {
    "max_num_batched_tokens": 64,
    "block_size": 32,
    "num_gpu_blocks_override": 10,
    "max_model_len": 256,
}


@dataclass(frozen=True)
class Job:
    rid: str
    client: str | None  # None: named by nothing but its adapter (if any)
    prompt: int  # prompt tokens
    max_tokens: int
    priority: int = 0  # vLLM's request priority
    at_step: int = 0  # added before this engine step (0: before the first)
    lora: str | None = None  # the LoRA adapter's name (a key of `drive`'s `loras`)
    seed: int | None = None  # of the prompt's tokens; default: the job's position
    system: tuple[int, int] | None = None  # (tokens, seed) of a system prompt the prompt starts with, shared by seed


@dataclass
class Run:
    finished_at: dict[str, int] = field(default_factory=dict)  # request id -> engine step it finished in
    outputs: dict[str, int] = field(default_factory=dict)  # request id -> output tokens produced
    cached: dict[str, int] = field(default_factory=dict)  # request id -> vLLM's num_cached_tokens (prefix cache)
    tokens: dict[str, list[int]] = field(default_factory=dict)  # request id -> the output token ids
    admitted: list[str] = field(default_factory=list)  # request ids in the order vLLM first scheduled them
    admitted_at: dict[str, int] = field(default_factory=dict)  # request id -> the engine step that was
    priority: dict[str, int] = field(default_factory=dict)  # request id -> vLLM's `priority` once it was queued
    preempted: dict[str, int] = field(default_factory=dict)  # request id -> times vLLM preempted it
    scheduled: list[dict[str, int]] = field(default_factory=list)  # per engine step: request id -> tokens scheduled
    steps: int = 0
    preemptions: int = 0
    service_at: list[dict[str, float]] = field(default_factory=list)  # each client's service after each step
    queued_at: list[dict[str, int]] = field(default_factory=list)  # each client's queued requests after each step
    counter_at: list[dict[str, float]] = field(default_factory=list)  # each node's counter (groups too) after each


# engine settings: small batches, so requests queue; name -> (VTC?, extra LLM arguments, environment)
CONFIGS: dict[str, tuple[bool, dict[str, Any], dict[str, str]]] = {
    # priorities need vLLM's priority scheduling policy (its preemption victims): the tenants below may name 0 or 1
    "vtc": (
        True,
        {"scheduling_policy": "priority"},
        {
            "FAIRSERVE_WEIGHTS": "w2=2",
            "FAIRSERVE_PRIORITIES": "free=1",
            "FAIRSERVE_ALLOWED_PRIORITIES": "prio-hi=0|1",
        },
    ),
    "default": (False, {}, {}),
    # 7 usable blocks of 32 tokens: a few long requests cannot all stay resident, vLLM preempts
    "tiny-kv": (
        True,
        {"num_gpu_blocks_override": 8, "block_size": 32, "max_model_len": 128, "scheduling_policy": "priority"},
        {"FAIRSERVE_PRIORITIES": "vic-lo=1"},
    ),
    # preemption (tests_vllm/test_preemption.py): priority that preempts, fairness-triggered at a gap of 100
    "preempt": (
        True,
        {"scheduling_policy": "priority"},
        {
            "FAIRSERVE_POLICY": "vtc:preempt-priority=1:preempt=100:preempt-max=1",
            "FAIRSERVE_PRIORITIES": "pb=1",
            "FAIRSERVE_ALLOWED_PRIORITIES": "pu=0|1",
        },
    ),
    # one LoRA slot for the adapters of the tests (tests_vllm/test_lora.py); the tenant is the adapter
    "lora": (True, LORA, {"FAIRSERVE_LORA_WAIT_STEPS": "4"}),  # test_lora.K
    "lora-default": (False, LORA, {}),
    # vLLM's own scheduler, automatic prefix caching: 23 usable blocks of 32 tokens (test_prefix_cache.py)
    "prefix-cache": (False, {"enable_prefix_caching": True, "block_size": 32, "num_gpu_blocks_override": 24}, {}),
    # fairserve over vLLM's prefix cache (test_dlpm.py): the same pool, DLPM with its quantum, VTC beside it
    "dlpm": (True, PREFIX_ENGINE, {"FAIRSERVE_POLICY": "dlpm:600", "FAIRSERVE_W_CACHED": "0.25"}),
    "vtc-prefix": (True, PREFIX_ENGINE, {"FAIRSERVE_W_CACHED": "0.25"}),
    # the simulator's vLLM mode against vLLM (test_vllm_mode.py), under VTC and FCFS
    "steps": (True, STEPS_ENGINE, {}),
    "steps-fcfs": (True, STEPS_ENGINE, {"FAIRSERVE_POLICY": "fcfs"}),
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


def drive(
    llm: Any,
    jobs: Iterable[Job],
    abort: dict[str, int] | None = None,
    max_steps: int = 5000,
    loras: dict[str, Any] | None = None,
) -> Run:
    """Add the jobs to the engine (in order, each before its `at_step`) and step it until all are done. `abort`:
    request id -> the step after which it is aborted (as vLLM does when a client goes away); `loras`: adapter name
    -> vLLM's `LoRARequest`."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    sched = scheduler_of(llm)
    run = Run()
    pending = list(enumerate(jobs))
    abort = dict(abort or {})
    ids: dict[str, str] = {}  # vLLM's engine-core request id ("<id>-<8 hex>") -> the job's
    preempted: dict[str, int] = {}
    produced: dict[str, int] = {}  # output tokens so far

    def add_due() -> None:  # the jobs due before the next step
        while pending and pending[0][1].at_step <= run.steps + 1:
            i, job = pending.pop(0)
            extra = {} if job.client is None else {CLIENT_ARG: job.client}
            params = SamplingParams(max_tokens=job.max_tokens, ignore_eos=True, temperature=0.0, extra_args=extra)
            token_ids = prompt_ids(job.prompt, i if job.seed is None else job.seed)
            if job.system is not None:  # NOTE: the prompt's first tokens are the system prompt's
                token_ids[: job.system[0]] = prompt_ids(job.system[0], job.system[1])
            prompt = {"prompt_token_ids": token_ids}
            lora = None if job.lora is None else (loras or {})[job.lora]
            engine.add_request(job.rid, prompt, params, lora_request=lora, priority=job.priority)
        for rid, req in sched.requests.items():
            if rid not in ids:
                ids[rid] = rid.rsplit("-", 1)[0]
                run.priority[ids[rid]] = req.priority  # as the scheduler left it once queued

    def abort_due() -> None:
        for rid, step in list(abort.items()):
            if step == run.steps:
                run.outputs[rid] = produced.get(rid, 0)
                engine.abort_request([rid])
                del abort[rid]

    schedule = sched.schedule

    def recording_schedule(*args: Any, **kwargs: Any) -> Any:
        out = schedule(*args, **kwargs)
        run.scheduled.append({ids.get(k, k): n for k, n in out.num_scheduled_tokens.items()})
        for new in out.scheduled_new_reqs:
            rid = ids.get(new.req_id, new.req_id)
            if rid not in run.admitted_at:
                run.admitted.append(rid)
                run.admitted_at[rid] = run.steps
        return out

    sched.schedule = recording_schedule
    try:
        add_due()
        abort_due()  # step 0: before the first step, still waiting
        while pending or engine.has_unfinished_requests():
            run.steps += 1
            if run.steps > max_steps:
                raise AssertionError(f"the engine did not finish in {max_steps} steps")
            for out in engine.step():
                produced[out.request_id] = len(out.outputs[0].token_ids)
                if out.num_cached_tokens:  # NOTE: set from the first output on
                    run.cached[out.request_id] = out.num_cached_tokens
                if out.finished and out.request_id not in run.outputs:
                    run.finished_at[out.request_id] = run.steps
                    run.outputs[out.request_id] = len(out.outputs[0].token_ids)
                    run.tokens[out.request_id] = list(out.outputs[0].token_ids)
            for rid, req in sched.requests.items():
                job_id = ids.get(rid, rid)
                preempted[job_id] = max(preempted.get(job_id, 0), req.num_preemptions)
            abort_due()
            if hasattr(sched, "fairserve"):
                view = sched.fairserve.engine_queue.view()
                run.service_at.append({t: v.service for t, v in view.tenants.items()})
                run.queued_at.append({t: v.queued for t, v in view.tenants.items()})
                run.counter_at.append({t: v.counter for t, v in (view.tenants | view.groups).items()})
            add_due()
    finally:
        del sched.schedule
    run.preempted = {rid: n for rid, n in preempted.items() if n}
    run.preemptions = sum(preempted.values())
    return run


def expected_service(jobs: Iterable[Job], outputs: dict[str, int]) -> dict[str, float]:
    total: dict[str, float] = {}
    for job in jobs:
        total[job.client] = total.get(job.client, 0.0) + W_P * job.prompt + W_Q * outputs[job.rid]
    return total
