"""vLLM's request `priority` under fairserve (vLLM's CPU build): levels served strictly, the tenant tree within a
level, and the `--scheduling-policy priority` fairserve requires for vLLM's preemption victims. The engine "vtc"
runs with FAIRSERVE_PRIORITIES=free=1 (the group `free` at 1) and FAIRSERVE_ALLOWED_PRIORITIES=prio-hi=0|1."""

from __future__ import annotations

import copy
import statistics

import pytest
from engine import Job, drive, scheduler_of

from fairserve.engines import vllm_scheduler


def test_priority_0_is_admitted_before_waiting_priority_1_work_and_a_level_shares_by_the_tree(engines):
    llm = engines.get("vtc")
    # prio-hi is served alone first, at priority 1 (it may name it): its counter is then the higher one
    warm = drive(llm, [Job(f"pw-{i}", "prio-hi", 48, 12, priority=1) for i in range(4)])
    assert set(warm.priority.values()) == {1}
    heavy = [Job(f"fh-{i}", "free/heavy", 48, 12) for i in range(12)]  # they name 0 (vLLM's default): not
    light = [Job(f"fl-{i}", "free/light", 48, 12) for i in range(4)]  # allowed, so their group's level, 1
    urgent = [Job(f"pu-{i}", "prio-hi", 48, 12, priority=0, at_step=3) for i in range(4)]
    run = drive(llm, heavy + light + urgent)
    assert {run.priority[j.rid] for j in heavy + light} == {1} and {run.priority[j.rid] for j in urgent} == {0}

    counters = run.counter_at[1]  # after step 2, when the urgent requests arrive
    assert counters["prio-hi"] > counters["free"], counters  # by counters alone VTC would serve free first
    waiting = [j.rid for j in heavy + light if run.admitted_at[j.rid] >= 3]  # not admitted when they arrived
    assert len(waiting) == 12  # four were running (a higher level still waits for running requests: the floor)
    last_urgent = max(run.admitted.index(j.rid) for j in urgent)
    assert last_urgent < min(run.admitted.index(rid) for rid in waiting), run.admitted

    # within level 1, the tree: free/light's median request finishes before most of free/heavy's backlog
    light_median = statistics.median(run.finished_at[j.rid] for j in light)
    heavy_steps = [run.finished_at[j.rid] for j in heavy]
    assert sum(step < light_median for step in heavy_steps) < len(heavy) / 2, (light_median, sorted(heavy_steps))


def test_vllm_preempts_the_lower_priority_request(engines):
    """7 KV blocks of 32 tokens for three requests of 100: vLLM must preempt. Under `--scheduling-policy priority`
    its victim is the running request of the worst level (then the latest arrival): never the priority-0 one,
    although it was admitted last (`fcfs` would preempt the request admitted last)."""
    llm = engines.get("tiny-kv")  # FAIRSERVE_PRIORITIES=vic-lo=1
    lo = [Job(f"vic-lo-{i}", "vic-lo", 40, 60) for i in range(2)]
    hi = Job("vic-hi-0", "vic-hi", 40, 60, at_step=2)
    run = drive(llm, [*lo, hi])
    assert run.admitted[-1] == hi.rid and run.priority[hi.rid] == 0 and run.priority[lo[0].rid] == 1
    assert run.preempted and hi.rid not in run.preempted, run.preempted
    assert run.finished_at[hi.rid] < min(run.finished_at[j.rid] for j in lo)
    assert all(run.outputs[j.rid] == 60 for j in (*lo, hi))


def test_priorities_refuse_to_start_under_fcfs(engines, monkeypatch):
    from vllm.v1.structured_output import StructuredOutputManager

    engine_sched = scheduler_of(engines.get("vtc"))
    config = copy.deepcopy(engine_sched.vllm_config)
    config.scheduler_config.policy = "fcfs"
    monkeypatch.setenv("FAIRSERVE_PRIORITIES", "free=1")
    with pytest.raises(ValueError, match="--scheduling-policy priority"):
        vllm_scheduler.VTCSyncScheduler(
            vllm_config=config,
            kv_cache_config=engine_sched.kv_cache_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=engine_sched.block_size,
            log_stats=False,
        )
