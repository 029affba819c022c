"""Preemption inside vLLM (engines/vllm_preempt.py, docs/vllm.md "Preemption"), in vLLM's CPU build: priority that
preempts (`preempt-priority=1`), fairness-triggered preemption (`preempt=DELTA`), both bounded by `preempt-max`, and
memory victims by counter (`victim=counter`). The engine "preempt" runs `vtc:preempt-priority=1:preempt=100`
with `FAIRSERVE_PRIORITIES=pb=1` (the group `pb` at level 1) and `FAIRSERVE_ALLOWED_PRIORITIES=pu=0|1`; each test's
"without" run is the same engine with the options off. Each run's tenants are its own (their counters start fresh)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

from engine import Job, drive, expected_service, scheduler_of

from fairserve.engines.vllm_config import PreemptOptions

OFF = PreemptOptions(victim_by_counter=True)


@contextmanager
def options(llm, opts: PreemptOptions):
    preemptor = scheduler_of(llm).fairserve_preempt
    saved, preemptor.options = preemptor.options, opts
    try:
        yield preemptor
    finally:
        preemptor.options = saved


def service(llm, tenants):
    view = scheduler_of(llm).fairserve.engine_queue.view()
    return {t: view.tenants[t].service for t in tenants}


def test_the_spec_reaches_the_engine_and_vllm_has_what_the_plugin_calls(engines):
    """What the plugin relies on in vLLM 0.32 (vllm_preempt's docstring), pinned."""
    sched = scheduler_of(engines.get("preempt"))
    assert sched.fairserve_preempt.options == PreemptOptions(True, True, 100.0, 1)
    assert isinstance(sched.running, list) and callable(sched._preempt_request)
    assert sched.max_num_running_reqs == 4 and sched.max_num_scheduled_tokens > 0 and sched.block_size > 0
    kv = sched.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() > 0 and isinstance(kv.watermark_blocks, int)
    import inspect

    params = list(inspect.signature(sched._preempt_request).parameters)
    assert params[:2] == ["request", "timestamp"], params


def test_priority_preempts_a_full_batch_and_outputs_are_unchanged(engines):
    """A batch full of level-1 requests with long outputs (`max_num_seqs` 4, 8 requests); a level-0 request arrives
    before step 10: with `preempt-priority=1` it runs at once, one batch request preempted once; without, it waits
    for a finish. Every request's greedy output is the same in both runs; the ledger charged what was produced."""
    llm = engines.get("preempt")
    batch = [Job(f"pp-b{i}", "pb/with", 16, 64, seed=i) for i in range(8)]  # level 1: their group pb
    urgent = Job("pp-u", "pu-with", 16, 16, at_step=10, seed=99)  # level 0
    with options(llm, replace(OFF, priority=True)) as p:
        before = p.counts.for_priority
        run = drive(llm, [*batch, urgent])
        assert p.counts.for_priority - before == 1
        assert service(llm, ["pb/with", "pu-with"]) == expected_service([*batch, urgent], run.outputs)
    assert run.priority[urgent.rid] == 0 and run.priority[batch[0].rid] == 1
    assert run.admitted_at[urgent.rid] <= urgent.at_step + 1, run.admitted_at  # running within 2 steps
    assert list(run.preempted.values()) == [1], run.preempted  # one batch request, once
    (victim,) = run.preempted
    assert victim in {j.rid for j in batch[:4]}

    with options(llm, OFF):
        plain = drive(llm, [replace(j, client="pb/without") for j in batch] + [replace(urgent, client="pu-without")])
        alone = drive(llm, [replace(urgent, client="pu-alone", at_step=0)])
    wait = plain.admitted_at[urgent.rid] - urgent.at_step
    assert wait >= 50 and not plain.preempted, (wait, plain.preempted)  # it waits for a finish
    assert run.tokens[victim] == plain.tokens[victim] and len(run.tokens[victim]) == 64
    assert all(run.tokens[j.rid] == plain.tokens[j.rid] for j in [*batch, urgent])
    # its latency in engine steps (from the step it arrived before) beside the batch, against alone
    latency = run.finished_at[urgent.rid] - urgent.at_step + 1
    assert latency <= 1.2 * alone.finished_at[urgent.rid], (latency, alone.finished_at)


def test_fairness_preempts_for_a_tenant_far_below(engines):
    """A heavy tenant's 4 requests fill every slot (nothing of it queued, so a newcomer's counter is not lifted to
    its own); a light tenant arrives before step 12. With `preempt=100` its request runs within 2 steps, one heavy
    request preempted once (`preempt-max=1`); without, it waits for a heavy request to finish."""
    llm = engines.get("preempt")
    jobs = [Job(f"fp-h{i}", "fp/heavy", 16, 64, seed=i) for i in range(4)]
    light = Job("fp-l", "fp/light", 16, 16, at_step=12, seed=50)
    with options(llm, replace(OFF, delta=100.0)) as p:
        before = p.counts.for_fairness
        run = drive(llm, [*jobs, light])
        assert p.counts.for_fairness - before == 1
        assert service(llm, ["fp/heavy", "fp/light"]) == expected_service([*jobs, light], run.outputs)
    assert run.admitted_at[light.rid] <= light.at_step + 1, run.admitted_at
    assert list(run.preempted.values()) == [1] and next(iter(run.preempted)) in {j.rid for j in jobs}
    with options(llm, OFF):
        plain = drive(llm, [replace(j, client="fq/heavy") for j in jobs] + [replace(light, client="fq/light")])
    assert plain.admitted_at[light.rid] - light.at_step >= 50 and not plain.preempted
    assert all(run.tokens[j.rid] == plain.tokens[j.rid] for j in [*jobs, light])


def test_memory_victims_are_the_highest_counter_tenants_at_the_worst_level(engines):
    """8 KV blocks of 32 tokens (7 usable) for three requests of 40 + 60 tokens: vLLM must preempt. Every victim is
    a running request of the tenant with the highest counter among the running ones at the worst level; the tenant
    `mv-b` (warmed first: its counter is the higher) is the victim, though `mv-a`'s request arrived last (vLLM's
    rule, `victim=vllm`, takes that one)."""
    llm = engines.get("tiny-kv")
    sched = scheduler_of(llm)
    assert sched.fairserve_preempt.options.victim_by_counter  # the default with vtc
    seen: list[tuple[str, dict[str, float], bool]] = []  # victim's tenant, counters at its level, worst level?
    preempt = sched._preempt_request

    def recording(request, *args, **kwargs):
        eq = sched.fairserve.engine_queue
        victim = eq.request(request.request_id)
        others = [eq.request(r.request_id) for r in sched.running]  # the victim has left `running` already
        same = {r.tenant: r.account.counter for r in others if r.priority == victim.priority}
        worst = all(r.priority <= victim.priority for r in others)
        seen.append((victim.tenant, same | {victim.tenant: victim.account.counter}, worst))
        return preempt(request, *args, **kwargs)

    sched._preempt_request = recording
    try:
        drive(llm, [Job("mv-w", "mv-b", 40, 20)])  # mv-b's counter first
        jobs = [Job("mv-b-0", "mv-b", 40, 60), Job("mv-b-1", "mv-b", 40, 60), Job("mv-a-0", "mv-a", 40, 60, at_step=2)]
        before = sched.fairserve_preempt.counts.for_memory
        run = drive(llm, jobs)
        assert sched.fairserve_preempt.counts.for_memory > before  # the plugin's count decided, before vLLM's rule
        by_counter = list(seen)
        seen.clear()
        with options(llm, PreemptOptions(victim_by_counter=False)):
            vllm_rule = drive(llm, [replace(j, client=j.client.replace("mv-", "mw-")) for j in jobs])
    finally:
        del sched._preempt_request
    assert run.preempted and by_counter, run.preempted
    for tenant, counters, worst in by_counter:
        assert worst and counters[tenant] == max(counters.values()), by_counter
    assert "mv-a-0" not in run.preempted and all(run.outputs[j.rid] == 60 for j in jobs)
    assert "mv-a-0" in vllm_rule.preempted, vllm_rule.preempted  # vLLM's rule: the latest arrival
    assert all(run.tokens[j.rid] == vllm_rule.tokens[j.rid] for j in jobs)
