"""The async subclass (`VTCScheduler` over vLLM's `AsyncScheduler`): the CPU engine runs without async scheduling,
so the real scheduler classes are built directly with async scheduling on and fed model-runner outputs, one step
behind the schedule as vLLM's async engine loop does (the way vLLM's own tests/v1/core/ scheduler tests drive it)."""

from __future__ import annotations

import copy
from collections import deque

import pytest
from engine import W_P, W_Q, prompt_ids, scheduler_of

from fairserve.engines import vllm_scheduler
from fairserve.engines.vllm_scheduler import CLIENT_ARG


@pytest.fixture
def scheduler(engines):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.structured_output import StructuredOutputManager

    engine_sched = scheduler_of(engines.get("vtc"))
    config = copy.deepcopy(engine_sched.vllm_config)
    config.scheduler_config.async_scheduling = True
    config.scheduler_config.max_num_seqs = 2
    sched = vllm_scheduler.VTCScheduler(
        vllm_config=config,
        kv_cache_config=engine_sched.kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=engine_sched.block_size,
        log_stats=False,
    )
    assert type(sched) is vllm_scheduler.VTCScheduler and isinstance(sched, AsyncScheduler)
    return sched


def make_request(rid: str, client: str, prompt: int, max_tokens: int):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args={CLIENT_ARG: client})
    params.update_from_generation_config({}, eos_token_id=257)
    return Request(rid, prompt_ids(prompt, sum(map(ord, rid))), params, None)


def runner_output(scheduler_output):
    """What a model runner returns for a schedule: one sampled token (id 7) per request whose prefill completes."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)}, sampled_token_ids=[[7] for _ in ids]
    )


def run_async(sched, abort: dict[int, str] | None = None, max_steps: int = 1000) -> tuple[list[str], list[str]]:
    """vLLM's async loop: schedule step N+1 before step N's output is applied. Returns (admission order, finish
    order). `abort`: step -> request id aborted then (FINISHED_ABORTED, as a disconnect)."""
    from vllm.v1.request import RequestStatus

    admitted: list[str] = []
    finished: list[str] = []
    in_flight: deque = deque()
    for step in range(1, max_steps + 1):
        out = sched.schedule()
        admitted += [r.req_id for r in out.scheduled_new_reqs]
        if out.total_num_scheduled_tokens:
            in_flight.append(out)
        if len(in_flight) == 2 or (in_flight and not out.total_num_scheduled_tokens):
            done = in_flight.popleft()
            engine_outputs = sched.update_from_output(done, runner_output(done))
            for eco in engine_outputs.values():
                finished += [o.request_id for o in eco.outputs if o.finish_reason is not None]
        if abort and step in abort:
            sched.finish_requests(abort.pop(step), RequestStatus.FINISHED_ABORTED)
        if not sched.requests and not in_flight:
            return admitted, finished
    raise AssertionError("the scheduler did not finish")


def test_async_scheduler_orders_by_vtc_and_charges_exactly(scheduler):
    heavy = [make_request(f"h-{i}", "heavy", 40, 6) for i in range(6)]
    light = [make_request(f"l-{i}", "light", 40, 6) for i in range(2)]
    for r in heavy + light:
        scheduler.add_request(r)
    admitted, finished = run_async(scheduler)
    assert sorted(admitted) == sorted(r.request_id for r in heavy + light) and len(finished) == 8
    # both light requests are admitted among the first four, not after the heavy backlog (FCFS would)
    assert {"l-0", "l-1"} <= set(admitted[:4]), admitted
    accounts = scheduler.fairserve_accounts()
    assert accounts["heavy"].service == 6 * (W_P * 40 + W_Q * 6)
    assert accounts["light"].service == 2 * (W_P * 40 + W_Q * 6)
    assert not scheduler.waiting and accounts["heavy"].running == 0


def test_async_scheduler_abort_mid_decode_is_charged_what_was_produced(scheduler):
    a = make_request("a-0", "a", 30, 50)
    b = make_request("b-0", "b", 20, 4)
    waiting = make_request("a-1", "a", 60, 50)  # behind the 2 slots when aborted
    for r in (a, b, waiting):
        scheduler.add_request(r)
    produced: dict[str, int] = {}
    orig = scheduler.finish_requests

    def finish_requests(rid, status):  # record what the engine had produced when the abort arrived
        produced[rid] = scheduler.requests[rid].num_output_tokens
        return orig(rid, status)

    scheduler.finish_requests = finish_requests
    run_async(scheduler, abort={2: "a-1", 9: "a-0"})
    assert produced["a-1"] == 0 and 3 <= produced["a-0"] < 50
    accounts = scheduler.fairserve_accounts()
    assert accounts["a"].service == W_P * 30 + W_Q * produced["a-0"]
    assert accounts["b"].service == W_P * 20 + W_Q * 4
