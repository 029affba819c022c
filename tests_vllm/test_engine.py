"""fairserve's VTCScheduler inside a real vLLM engine (CPU build), driven step by step in this process."""

from __future__ import annotations

import statistics

import pytest
from engine import Job, drive, expected_service, prompt_ids, scheduler_of

from fairserve.engines.vllm_scheduler import VTCRequestQueue


def heavy_and_light(tag: str) -> list[Job]:
    """A heavy client's 24-request backlog, then a light client's 4 requests, all queued before the first step."""
    heavy = [Job(f"{tag}h-{i}", f"{tag}heavy", 48, 12) for i in range(24)]
    light = [Job(f"{tag}l-{i}", f"{tag}light", 48, 12) for i in range(4)]
    return heavy + light


def light_median_and_heavy_steps(run, jobs, tag):
    light = statistics.median(run.finished_at[j.rid] for j in jobs if j.client == f"{tag}light")
    heavy = [run.finished_at[j.rid] for j in jobs if j.client == f"{tag}heavy"]
    return light, heavy


def test_engine_builds_the_sync_scheduler_with_the_fairserve_queue(engines):
    sched = scheduler_of(engines.get("vtc"))
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    assert type(sched).__name__ == "VTCSyncScheduler"  # the CPU platform turns async scheduling off
    assert isinstance(sched, Scheduler) and not isinstance(sched, AsyncScheduler)
    assert isinstance(sched.waiting, VTCRequestQueue) and sched.fairserve.policy.name == "vtc"
    assert sched.fairserve.ledger.weights["w2"] == 2.0  # FAIRSERVE_WEIGHTS was read
    assert type(scheduler_of(engines.get("default"))) is Scheduler


def test_light_client_is_served_between_the_heavy_backlog_under_vtc_not_under_the_default(engines):
    jobs_vtc, jobs_default = heavy_and_light("v"), heavy_and_light("d")
    vtc = drive(engines.get("vtc"), jobs_vtc)
    default = drive(engines.get("default"), jobs_default)
    light, heavy = light_median_and_heavy_steps(vtc, jobs_vtc, "v")
    assert sum(step < light for step in heavy) < len(heavy) / 2, (light, sorted(heavy))
    light_d, heavy_d = light_median_and_heavy_steps(default, jobs_default, "d")
    assert light_d > max(heavy_d), (light_d, sorted(heavy_d))
    # same work in about the same number of engine steps
    assert abs(vtc.steps - default.steps) <= 0.1 * default.steps


def test_accounts_are_exact_per_client(engines):
    llm = engines.get("vtc")
    jobs = [Job(f"acc-a-{i}", "acc-a", 20 + 7 * i, 5 + 3 * i) for i in range(5)] + [
        Job(f"acc-b-{i}", "acc-b", 90 - 11 * i, 17 - 2 * i) for i in range(6)
    ]
    run = drive(llm, jobs)
    assert all(run.outputs[j.rid] == j.max_tokens for j in jobs)
    accounts = scheduler_of(llm).fairserve_accounts()
    want = expected_service(jobs, run.outputs)
    for client in ("acc-a", "acc-b"):
        assert accounts[client].service == want[client]
        assert accounts[client].queued == accounts[client].running == 0


def test_weights_give_the_weighted_split(engines):
    """FAIRSERVE_WEIGHTS=w2=2: while both are backlogged, w2 gets twice w1's service."""
    jobs = [Job(f"{c}-{i}", c, 32, 12) for i in range(16) for c in ("w1", "w2")]
    run = drive(engines.get("vtc"), jobs)
    half = sorted(run.finished_at.values())[len(jobs) // 2 - 1]  # half of the requests are done
    service = run.service_at[half - 1]
    assert 1.6 <= service["w2"] / service["w1"] <= 2.4, service
    assert scheduler_of(engines.get("vtc")).fairserve_accounts()["w2"].counter == pytest.approx(
        expected_service([j for j in jobs if j.client == "w2"], run.outputs)["w2"] / 2
    )


def test_preemption_requeues_without_a_second_charge(engines):
    llm = engines.get("tiny-kv")
    jobs = [Job(f"pre-{c}-{i}", f"pre-{c}", 40, 60) for i in range(3) for c in ("a", "b")]
    run = drive(llm, jobs)
    assert run.preemptions > 0  # the 7-block KV cache forced vLLM to preempt
    assert all(run.outputs[j.rid] == 60 for j in jobs)
    accounts = scheduler_of(llm).fairserve_accounts()
    want = expected_service(jobs, run.outputs)
    assert {c: accounts[c].service for c in want} == want


def test_aborted_requests_are_charged_only_what_was_produced(engines):
    llm = engines.get("vtc")
    filler = [Job(f"ab-f-{i}", "ab-filler", 30, 30) for i in range(3)]
    running = Job("ab-run", "ab", 50, 40)  # admitted at once, aborted after 6 steps
    waiting = Job("ab-wait", "ab", 70, 40)  # aborted before the first step, still waiting
    done = Job("ab-done", "ab", 25, 8)
    jobs = [running, *filler, waiting, done]
    run = drive(llm, jobs, abort={running.rid: 6, waiting.rid: 0})
    produced = run.outputs[running.rid]
    assert 1 <= produced < running.max_tokens and run.outputs[waiting.rid] == 0
    service = scheduler_of(llm).fairserve_accounts()["ab"].service
    assert service == 50 + 2 * produced + 25 + 2 * 8


def test_requests_skipped_while_their_grammar_compiles_are_charged_only_when_scheduled(engines):
    """vLLM pops a structured-output request whose grammar is still compiling and puts it back at the end of the
    pass (skip_request). Charges follow what the engine scheduled: nothing while skipped, the prompt once after."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    llm = engines.get("vtc")
    sched, engine = scheduler_of(llm), llm.llm_engine
    queue = sched.fairserve
    skipped: list[str] = []
    put_back = queue.prepend_requests

    def prepend_requests(requests):
        requests = list(requests)
        skipped.extend(r.request_id for r in requests)
        return put_back(requests)

    queue.prepend_requests = prepend_requests
    try:
        for i in range(3):
            schema = {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
            params = SamplingParams(
                max_tokens=8,
                temperature=0.0,
                extra_args={"fairserve_client": "grammar"},
                structured_outputs=StructuredOutputsParams(json=schema),
            )
            engine.add_request(f"gr-{i}", {"prompt_token_ids": prompt_ids(30, i)}, params)
        outputs: dict[str, int] = {}
        checked = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = len(out.outputs[0].token_ids)
            live = [r for r in sched.requests.values() if r.request_id.startswith("gr-")]
            scheduled = [r for r in live if r.num_computed_tokens > 0]
            if live and not outputs and len(scheduled) < len(live):  # some skipped: only the scheduled are charged
                produced = sum(r.num_output_tokens for r in scheduled)
                assert queue.ledger.service.get("grammar", 0.0) == 30 * len(scheduled) + 2 * produced
                checked += 1
    finally:
        del queue.prepend_requests
    assert skipped and checked, "no request was skipped while its grammar compiled"
    assert queue.ledger.service["grammar"] == 3 * (30 + 2 * 8) and outputs == {f"gr-{i}": 8 for i in range(3)}
