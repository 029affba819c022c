"""fairserve's VTCScheduler inside a real vLLM engine (CPU build), driven step by step in this process."""
from __future__ import annotations

import statistics

import pytest
from engine import Job, drive, expected_service, scheduler_of

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
    assert type(sched).__name__ == "VTCSyncScheduler"       # the CPU platform turns async scheduling off
    assert isinstance(sched, Scheduler) and not isinstance(sched, AsyncScheduler)
    assert isinstance(sched.waiting, VTCRequestQueue) and sched.fairserve.policy.name == "vtc"
    assert sched.fairserve.policy.weight("w2") == 2.0                     # FAIRSERVE_WEIGHTS was read
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
    jobs = [Job(f"acc-a-{i}", "acc-a", 20 + 7 * i, 5 + 3 * i) for i in range(5)] + \
           [Job(f"acc-b-{i}", "acc-b", 90 - 11 * i, 17 - 2 * i) for i in range(6)]
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
    half = sorted(run.finished_at.values())[len(jobs) // 2 - 1]       # half of the requests are done
    service = run.service_at[half - 1]
    assert 1.6 <= service["w2"] / service["w1"] <= 2.4, service
    assert scheduler_of(engines.get("vtc")).fairserve_accounts()["w2"].counter == pytest.approx(
        expected_service([j for j in jobs if j.client == "w2"], run.outputs)["w2"] / 2)


def test_preemption_requeues_without_a_second_charge(engines):
    llm = engines.get("tiny-kv")
    jobs = [Job(f"pre-{c}-{i}", f"pre-{c}", 40, 60) for i in range(3) for c in ("a", "b")]
    run = drive(llm, jobs)
    assert run.preemptions > 0                  # the 7-block KV cache forced vLLM to preempt
    assert all(run.outputs[j.rid] == 60 for j in jobs)
    accounts = scheduler_of(llm).fairserve_accounts()
    want = expected_service(jobs, run.outputs)
    assert {c: accounts[c].service for c in want} == want


def test_aborted_requests_are_charged_only_what_was_produced(engines):
    llm = engines.get("vtc")
    filler = [Job(f"ab-f-{i}", "ab-filler", 30, 30) for i in range(3)]
    running = Job("ab-run", "ab", 50, 40)          # admitted at once, aborted after 6 steps
    waiting = Job("ab-wait", "ab", 70, 40)          # aborted before the first step, still waiting
    done = Job("ab-done", "ab", 25, 8)
    jobs = [running, *filler, waiting, done]
    run = drive(llm, jobs, abort={running.rid: 6, waiting.rid: 0})
    produced = run.outputs[running.rid]
    assert 1 <= produced < running.max_tokens and run.outputs[waiting.rid] == 0
    service = scheduler_of(llm).fairserve_accounts()["ab"].service
    assert service == 50 + 2 * produced + 25 + 2 * 8
