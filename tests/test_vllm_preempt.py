"""The vLLM plugin's preemption options (engines/vllm_config.py PreemptOptions, from the policy spec) and the core's
victim rules it runs (core/preemption.py); the real engine: tests_vllm/test_preemption.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fairserve.core import Ledger, make_policy
from fairserve.core.preemption import priority_victims, victim_order
from fairserve.engines.vllm_config import PreemptOptions, VTCConfig

pytestmark = pytest.mark.unit


def opts(policy: str) -> PreemptOptions:
    return VTCConfig.from_env({"FAIRSERVE_POLICY": policy}).preempt_options()


def test_options_come_from_the_policy_spec():
    assert opts("vtc") == PreemptOptions(victim_by_counter=True, priority=False, delta=None, preempt_max=1)
    assert opts("vtc:preempt=500:preempt-max=2:preempt-priority=1") == PreemptOptions(True, True, 500.0, 2)
    assert opts("vtc:victim=vllm") == PreemptOptions(victim_by_counter=False)
    assert opts("fcfs") == PreemptOptions(victim_by_counter=False)  # no counters: vLLM's rule
    assert opts("fcfs:preempt-priority=1").priority
    assert VTCConfig.from_env({"FAIRSERVE_POLICY": "vtc:preempt=500"}).make_policy().name == "vtc"
    for spec, why in (
        ("vtc:running-cap=4000", "the simulator's"),
        ("fcfs:victim=counter", "keeps none"),
        ("fcfs:preempt=5", "keeps none"),
        ("vtc:victim=oldest", "counter"),
        ("vtc:preempt-priority=2", "0|1"),
        ("vtc:swap=1", "unknown engine option"),
    ):
        with pytest.raises(ValueError, match=why):
            VTCConfig.from_env({"FAIRSERVE_POLICY": spec})


@dataclass
class R:
    rid: str
    tenant: str
    level: int
    fair_preemptions: int = 0


def counters(**values: float) -> Ledger:
    ledger = Ledger(make_policy("vtc"), tuple(values))
    for tenant, c in values.items():
        ledger.accounts[tenant].counter = c
    return ledger


def test_victims_worst_level_then_highest_counter_then_newest():
    accounts = counters(a=10, b=50, c=30).accounts
    running = [R("a0", "a", 1), R("b0", "b", 1), R("c0", "c", 2), R("b1", "b", 1), R("a1", "a", 2)]
    assert [r.rid for r in victim_order(running, accounts)] == ["c0", "a1", "b1", "b0", "a0"]


def test_priority_victims_take_worse_levels_only_as_few_as_fit_and_at_most_k_times():
    accounts = counters(a=10, b=50, u=0).accounts
    running = [R("a0", "a", 1), R("b0", "b", 1), R("b1", "b", 1, fair_preemptions=1), R("e0", "a", 0)]
    head = R("u0", "u", 0)

    def slots(free: int):
        return lambda h, without: len(without) >= free

    assert [r.rid for r in priority_victims(head, running, accounts, 1, slots(1))] == ["b0"]
    assert [r.rid for r in priority_victims(head, running, accounts, 2, slots(2))] == ["b1", "b0"]
    assert priority_victims(head, running, accounts, 1, slots(3)) == []  # all of them would not do: none
    assert priority_victims(R("x", "u", 1), running, accounts, 1, slots(1)) == []  # an equal level: never


def test_the_queue_holds_back_victims_and_closes_for_a_pass():
    from fairserve.engines.vllm_queue import VTCRequestQueue

    q = VTCRequestQueue.from_config(VTCConfig())

    @dataclass
    class Item:
        request_id: str
        num_prompt_tokens: int = 8
        priority: int = 0

    for rid in ("x-1", "x-2"):
        q.add_request(Item(rid))
    q.hold_ids({"x-1"})
    assert q.head().request_id == "x-2"
    q.end_pass()
    assert q.head().request_id == "x-1"
    q.close_pass()
    assert q.head() is None and not q and len(q) == 2
    q.end_pass()
    assert q and q.peek_request().request_id == "x-1"


def test_with_room_for_any_step_the_pass_reads_nothing_of_the_running_set():
    from types import SimpleNamespace

    from fairserve.engines.vllm_preempt import Preemptor
    from fairserve.engines.vllm_queue import VTCRequestQueue

    asked: list[str] = []
    kv = SimpleNamespace(
        block_pool=SimpleNamespace(get_num_free_blocks=lambda: free),
        get_block_ids=lambda rid: asked.append(rid) or ([1, 2],),
    )
    running = [
        SimpleNamespace(request_id=f"r{i}", num_tokens_with_spec=40, num_output_placeholders=0, num_computed_tokens=39)
        for i in range(4)
    ]
    sched = SimpleNamespace(running=running, kv_cache_manager=kv, max_num_scheduled_tokens=64, block_size=16)
    p = Preemptor(opts("vtc"), VTCRequestQueue.from_config(VTCConfig()))
    free = 64 // 16 + 2 * 4 + 1  # more than the step could take: its budget in blocks, two partial blocks each
    p.before_pass(sched)
    assert asked == []
    free = 64 // 16 + 2 * 4  # at the edge: the running set is read (and here nothing is short: no victim)
    p.before_pass(sched)
    assert asked == ["r0", "r1", "r2", "r3"] and p.counts.for_memory == 0
