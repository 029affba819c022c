"""The simulator's vLLM mode (sim/vllm_steps.py, `--engine-mode vllm`) against vLLM itself: the same requests, added
before the same engine steps, run by vLLM's CPU build with fairserve's plugin and by the simulator with one second a
step. Each step schedules the same requests for the same number of tokens (chunked prefills in a 64-token budget,
decodes, admissions stopped by the pool, preemptions), and the ledgers charge each tenant the same service."""

from __future__ import annotations

from engine import Job, drive, scheduler_of

from fairserve.core import Ledger, make_policy
from fairserve.sim.latency import ConstantLatency
from fairserve.sim.requests import EngineConfig, SimRequest
from fairserve.sim.vllm_steps import VllmEngine
from fairserve.workloads.base import Arrival


class Recording(VllmEngine):
    """The simulated engine, with what each step scheduled (by the jobs' ids)."""

    def __init__(self, *args, ids: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ids, self.schedules = ids, []

    def _schedule(self, now: float) -> list[tuple[SimRequest, int]]:
        out = super()._schedule(now)
        self.schedules.append({self.ids[r.id]: n for r, n in out})
        return out


def simulate_like(llm, jobs: list[Job], policy: str) -> Recording:
    sched = scheduler_of(llm)
    assert not sched.running and not sched.waiting
    blocks = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    config = EngineConfig(
        kv_tokens=blocks * sched.block_size,
        mode="vllm",
        batch_max_tokens=sched.max_num_scheduled_tokens,
        running_max=sched.max_num_running_reqs,
        block_tokens=sched.block_size,
    )
    # NOTE: a job added before step k (steps count from 1) arrives as step k starts, at k - 1 seconds
    arrivals = [Arrival(max(j.at_step, 1) - 1.0, j.client, j.prompt, j.max_tokens) for j in jobs]
    one_second = ConstantLatency(prefill_s_fixed=1.0, decode_s=1.0)  # a step of any kind
    engine = Recording(Ledger(make_policy(policy)), one_second, config, ids=[j.rid for j in jobs])
    engine.run(arrivals)
    return engine


def jobs_for(tag: str) -> list[Job]:
    """A heavy tenant whose outputs outgrow the pool (preemptions; re-prefills of more than a step's budget), and a
    light one arriving from step 2 with short requests, the newest running when the pool runs short: under VTC the
    plugin's victim is the heavy tenant's newest (`victim=counter`), where vLLM's own rule would take the light one."""
    heavy = [Job(f"{tag}-h{i}", f"{tag}-heavy", 60, 80, at_step=i, seed=i) for i in range(4)]
    light = [Job(f"{tag}-l{i}", f"{tag}-light", 20, 60, at_step=2 + 3 * i, seed=10 + i) for i in range(3)]
    return sorted(heavy + light, key=lambda j: j.at_step)  # NOTE: `drive` adds them in order


def check_same(llm, jobs: list[Job], policy: str) -> None:
    sim = simulate_like(llm, jobs, policy)
    run = drive(llm, jobs)
    assert run.preemptions > 0 and sim.preemptions == run.preemptions  # the pool ran short in both
    assert any(n > 1 and n < 100 for step in run.scheduled for n in step.values())  # a prefill was chunked
    assert sim.schedules == run.scheduled
    view = scheduler_of(llm).fairserve.engine_queue.view()
    tenants = {j.client for j in jobs}
    assert {t: sim.ledger.accounts[t].service for t in tenants} == {t: view.tenants[t].service for t in tenants}


def test_vtc_steps_as_vllm_does(engines):
    check_same(engines.get("steps"), jobs_for("vm-vtc"), "vtc")


def test_fcfs_steps_as_vllm_does(engines):
    check_same(engines.get("steps-fcfs"), jobs_for("vm-fcfs"), "fcfs")
