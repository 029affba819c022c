"""fairserve's vLLM scheduler subclass over fakes of vLLM 0.33's Scheduler and AsyncScheduler; and, where vLLM is
installed, the real classes."""

from __future__ import annotations

import os
import pickle
from collections import deque
from types import SimpleNamespace

import pytest
from support.vllm_fakes import FakeRequest, Status, make_queue

from fairserve.engines.vllm_scheduler import SCHEDULER_PATH, VTCRequestQueue, scheduler_classes

pytestmark = pytest.mark.unit


# ---- the scheduler subclass over fakes of vLLM's Scheduler and AsyncScheduler -----------------------------------
class FakeScheduler:
    """The parts of vllm.v1.core.sched.scheduler.Scheduler (0.33) the subclass hooks into, reduced to one
    request per slot and one token per decode step; LoRA slots checked as vLLM's waiting loop does."""

    def __init__(
        self, vllm_config, kv_cache_config=None, structured_output_manager=None, block_size=16, **kwargs
    ) -> None:
        self.vllm_config = vllm_config
        self.waiting: deque = deque()  # stands in for FCFSRequestQueue; replaced by the subclass
        self.running: list = []
        self.requests: dict = {}
        self.ended: dict = {}  # the requests finish_requests ended, by id
        self.max_running = vllm_config.max_running
        self.lora_config = vllm_config.lora_config
        self.grammar_compile_error_reqs: set[str] = set()  # failed (FINISHED_ERROR) at the next update_from_output
        self.zero_tokens: set[str] = set()  # ids that get 0 new tokens this pass (e.g. the token budget is spent)
        self.skips_zero_token_head = True  # vLLM 0.33 skips such a request; 0.32 stops admitting

    def add_request(self, request) -> None:
        self.waiting.add_request(request)
        self.requests[request.request_id] = request

    def schedule(self) -> SimpleNamespace:
        scheduled = {}
        for r in self.running:
            scheduled[r.request_id] = 1
        skipped: deque = deque()
        loras = {r.lora_request.lora_int_id for r in self.running if r.lora_request}
        while self.waiting and len(self.running) < self.max_running:
            head = self.waiting.peek_request()
            if head.request_id in self.zero_tokens:
                if not self.skips_zero_token_head:
                    break
                skipped.appendleft(self.waiting.pop_request())  # 0.33's skip_request
                continue
            if (
                self.lora_config
                and head.lora_request
                and len(loras) == self.lora_config.max_loras
                and head.lora_request.lora_int_id not in loras
            ):
                skipped.appendleft(self.waiting.pop_request())  # "Scheduling would exceed max_loras, skip."
                continue
            r = self.waiting.pop_request()
            if r.lora_request:
                loras.add(r.lora_request.lora_int_id)
            self.running.append(r)
            scheduled[r.request_id] = r.num_prompt_tokens - r.num_computed_tokens
            r.num_computed_tokens = r.num_prompt_tokens
            r.status = Status.RUNNING
        if skipped:
            self.waiting.prepend_requests(skipped)
        return SimpleNamespace(num_scheduled_tokens=scheduled)

    def preempt_last(self) -> None:
        r = self.running.pop()
        r.status, r.num_computed_tokens = Status.PREEMPTED, 0
        r.num_preemptions += 1
        self.waiting.prepend_request(r)

    def update_from_output(self, scheduler_output, model_runner_output) -> dict:
        done = []
        for rid in scheduler_output.num_scheduled_tokens:
            r = self.requests.get(rid)
            if r is None or r.is_finished():
                continue
            r._output_token_ids += model_runner_output.sampled.get(rid, [])
            if r.num_output_tokens >= r.max_tokens:
                r.status = Status.FINISHED_LENGTH_CAPPED
                self._free_request(r)
                done.append(r)
        self.running = [r for r in self.running if r not in done]
        if self.grammar_compile_error_reqs:
            failed = sorted(self.grammar_compile_error_reqs)
            self.grammar_compile_error_reqs.clear()
            self.finish_requests(failed, Status.FINISHED_ERROR)
            done += [self.ended[rid] for rid in failed]
        return {0: [r.request_id for r in done]}

    def finish_requests(self, request_ids, status) -> None:
        for rid in request_ids:
            r = self.requests[rid]
            self.ended[rid] = r
            if r.status == Status.RUNNING:
                self.running.remove(r)
            else:
                self.waiting.remove_requests([r])
            r.status = status
            self._free_request(r)

    def _free_request(self, request, delay_free_blocks: bool = False):
        del self.requests[request.request_id]


class FakeAsyncScheduler(FakeScheduler):
    pass


def config(
    async_scheduling: bool | None, max_running: int = 1, policy: str = "fcfs", max_loras: int | None = None
) -> SimpleNamespace:
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling, policy=policy),
        max_running=max_running,
        lora_config=None if max_loras is None else SimpleNamespace(max_loras=max_loras),
    )


def step(s, tokens: int = 1) -> dict:
    out = s.schedule()
    sampled = {rid: [0] * tokens for rid in out.num_scheduled_tokens}
    return s.update_from_output(out, SimpleNamespace(sampled=sampled))


@pytest.fixture
def classes(monkeypatch):
    for name in [n for n in os.environ if n.startswith("FAIRSERVE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FAIRSERVE_POLICY", "vtc")
    return scheduler_classes(FakeScheduler, FakeAsyncScheduler)


def test_scheduler_picks_async_or_sync_base(classes):
    vtc, sync = classes
    s = vtc(config(True))
    assert type(s) is vtc and isinstance(s, FakeAsyncScheduler)
    assert type(vtc(config(None))) is vtc  # unresolved: vLLM's default is async
    s2 = vtc(vllm_config=config(False), kv_cache_config=None, block_size=16)  # as vLLM's EngineCore calls it
    assert type(s2) is sync and not isinstance(s2, FakeAsyncScheduler) and s2.vllm_config.max_running == 1
    for sched in (s, s2):
        assert isinstance(sched.waiting, VTCRequestQueue) and sched.waiting is sched.fairserve
    assert f"{vtc.__module__}.{vtc.__qualname__}" == SCHEDULER_PATH


def test_scheduler_charges_prompt_outputs_and_finish(classes):
    vtc, _ = classes
    s = vtc(config(True, max_running=1))
    s.add_request(FakeRequest("h-0", "heavy", prompt=40, max_tokens=3))
    s.add_request(FakeRequest("h-1", "heavy", prompt=40, max_tokens=3))
    s.add_request(FakeRequest("l-0", "light", prompt=4, max_tokens=3))
    s.add_request(FakeRequest("l-1", "light", prompt=4, max_tokens=3))
    admitted = []
    for _ in range(12):
        out = s.schedule()
        admitted += [rid for rid in out.num_scheduled_tokens if rid not in admitted]
        s.update_from_output(out, SimpleNamespace(sampled={rid: [0] for rid in out.num_scheduled_tokens}))
    assert admitted == ["h-0", "l-0", "l-1", "h-1"]  # light's counter stays below heavy's after h-0
    acc = s.fairserve_accounts()
    assert acc["heavy"].service == 2 * (40 + 2 * 3) and acc["light"].service == 2 * (4 + 2 * 3)
    assert acc["heavy"].running == acc["light"].running == 0 and not s.requests


def test_scheduler_preemption_and_abort(classes):
    vtc, _ = classes
    s = vtc(config(False, max_running=2))
    a, b = FakeRequest("a-0", "a", prompt=10, max_tokens=9), FakeRequest("b-0", "b", prompt=10, max_tokens=9)
    s.add_request(a)
    s.add_request(b)
    step(s)  # both admitted, one token each
    assert s.fairserve.ledger.service == {"a": 12.0, "b": 12.0}
    s.preempt_last()  # b goes back, keeps its charge
    step(s)  # b re-admitted (re-prefill not charged), both decode
    assert s.fairserve.ledger.service == {"a": 14.0, "b": 14.0}
    s.finish_requests(["b-0"], Status.FINISHED_ABORTED)
    assert s.fairserve.ledger.service["b"] == 14.0 and s.fairserve.engine_queue.request("b-0") is None
    s.add_request(c := FakeRequest("c-0", "c", prompt=30))
    s.add_request(FakeRequest("c-1", "c", prompt=30))
    step(s)  # c-0 admitted into b's slot; c-1 waits
    s.finish_requests(["c-1"], Status.FINISHED_ABORTED)
    assert s.fairserve.ledger.service["c"] == 30 + 2 * 1 and not s.waiting
    assert c.status == Status.RUNNING


@pytest.mark.parametrize("skips", [True, False], ids=["vllm-0.33-skips", "vllm-0.32-stops"])
def test_head_with_no_tokens_this_pass_is_not_charged(classes, skips):
    """vLLM 0.33 (scheduler.py, waiting loop: `if num_new_tokens == 0: skip_request(request_queue); continue`) pops
    a request it cannot give tokens to and puts it back at the end of the pass; 0.32 `break`s there instead."""
    vtc, _ = classes
    s = vtc(config(True, max_running=4))
    s.skips_zero_token_head = skips
    s.add_request(FakeRequest("h-0", "heavy", prompt=100, max_tokens=2))
    s.add_request(FakeRequest("l-0", "light", prompt=5, max_tokens=2))
    s.zero_tokens = {"h-0"}
    out = s.schedule()
    assert list(out.num_scheduled_tokens) == (["l-0"] if skips else [])
    assert s.fairserve.ledger.service == {"heavy": 0.0, "light": 5.0 if skips else 0.0}
    assert s.fairserve_accounts()["heavy"].queued == 1
    s.update_from_output(out, SimpleNamespace(sampled={rid: [0] for rid in out.num_scheduled_tokens}))
    s.zero_tokens = set()
    out = s.schedule()
    assert "h-0" in out.num_scheduled_tokens and s.fairserve.ledger.service["heavy"] == 100.0  # charged once


def run(s, max_steps: int = 500) -> list[str]:
    """Step until every request is done; the admission order."""
    admitted: list[str] = []
    for _ in range(max_steps):
        out = s.schedule()
        admitted += [rid for rid in out.num_scheduled_tokens if rid not in admitted]
        s.update_from_output(out, SimpleNamespace(sampled={rid: [0] for rid in out.num_scheduled_tokens}))
        if not s.requests:
            return admitted
    raise AssertionError("the scheduler did not finish")


def adapter_backlogs(s, base: int = 0) -> None:
    """Adapter a's 8 requests of uneven lengths (a always has one running: it keeps the one slot), b's 4."""
    for i in range(8):
        s.add_request(FakeRequest(f"a-{i}", prompt=10, max_tokens=3 + (5 * i) % 7, lora=("a", 1)))
    for i in range(4):
        s.add_request(FakeRequest(f"b-{i}", prompt=10, max_tokens=4, lora=("b", 2)))
    for i in range(base):
        s.add_request(FakeRequest(f"base-{i}", "base", prompt=10, max_tokens=4))


def test_without_the_lora_slot_rule_the_lowest_counter_adapter_starves(classes, monkeypatch):
    monkeypatch.setenv("FAIRSERVE_LORA_WAIT_STEPS", "off")
    vtc, _ = classes
    s = vtc(config(True, max_running=2, max_loras=1))
    adapter_backlogs(s)
    order = run(s)
    # b has the smaller counter from the second admission on, yet waits for all of a: a never leaves the slot
    assert max(order.index(f"a-{i}") for i in range(8)) < min(order.index(f"b-{i}") for i in range(4)), order
    assert s.fairserve_slots.held_steps == 0


def test_the_lora_slot_rule_serves_both_adapters_in_turns(classes, monkeypatch):
    monkeypatch.setenv("FAIRSERVE_LORA_WAIT_STEPS", "1")
    vtc, _ = classes
    s = vtc(config(True, max_running=2, max_loras=1))
    adapter_backlogs(s)
    order = run(s)
    assert s.fairserve_slots.held_steps > 0
    assert order == ["a-0", "a-1", "b-0", "b-1", "b-2", "b-3", "a-2", "a-3", "a-4", "a-5", "a-6", "a-7"]
    acc = s.fairserve_accounts()  # held requests were put back uncharged: every request charged once
    assert set(acc) == {"a", "b"}  # the adapters are the tenants (nothing else named one)
    assert acc["a"].service == sum(10 + 2 * (3 + (5 * i) % 7) for i in range(8))
    assert acc["b"].service == 4 * (10 + 2 * 4) and acc["a"].queued == acc["b"].running == 0


def test_base_model_requests_are_not_held_back(classes, monkeypatch):
    monkeypatch.setenv("FAIRSERVE_LORA_WAIT_STEPS", "0")
    vtc, _ = classes
    s = vtc(config(True, max_running=3, max_loras=1))
    for i, tokens in enumerate((2, 8, 8, 2)):
        s.add_request(FakeRequest(f"a-{i}", prompt=10, max_tokens=tokens, lora=("a", 1)))
    s.add_request(FakeRequest("b-0", prompt=10, max_tokens=2, lora=("b", 2)))
    step(s)  # a-0, a-1, a-2 run; b-0 blocked at the head
    s.add_request(FakeRequest("base-0", "base", prompt=10, max_tokens=2))
    order = run(s)  # a-0 ends first: room for one
    assert order[3:] == ["base-0", "b-0", "a-3"], order  # a-3 held back until b had its turn; base-0 was not


def test_the_rule_waits_k_steps_and_lets_go(classes, monkeypatch):
    monkeypatch.setenv("FAIRSERVE_LORA_WAIT_STEPS", "3")
    vtc, _ = classes
    s = vtc(config(True, max_running=2, max_loras=1))
    adapter_backlogs(s)
    slots = s.fairserve_slots
    blocked = []
    while s.requests:
        step(s)
        blocked.append(slots.blocked)
        if any(r.request_id.startswith("b-") for r in s.running):
            break
    assert blocked[:4] == [1, 2, 3, 4]  # b blocked at the head from the first step; held back a after 3
    assert slots.held_steps >= 1 and not slots.holding  # b holds the slot: the rule let go


def test_priorities_need_vllms_priority_scheduling_policy(classes, monkeypatch):
    vtc, _ = classes
    vtc(config(True, policy="fcfs"))  # no priorities: either policy
    monkeypatch.setenv("FAIRSERVE_ALLOWED_PRIORITIES", "a=0|1")
    with pytest.raises(ValueError, match="--scheduling-policy priority"):
        vtc(config(True, policy="fcfs"))
    assert vtc(config(True, policy="priority")).fairserve.ledger.allowed_priorities("a") == {0, 1}


def test_priority_levels_are_strict_and_vllm_sees_the_level_a_request_runs_at(classes, monkeypatch):
    monkeypatch.setenv("FAIRSERVE_PRIORITIES", "free=1")
    monkeypatch.setenv("FAIRSERVE_ALLOWED_PRIORITIES", "pro/hi=0|1,lo=0|1")
    vtc, _ = classes
    s = vtc(config(True, max_running=1, policy="priority"))
    s.add_request(FakeRequest("hi-0", "pro/hi", prompt=100, max_tokens=1))
    run(s)  # pro/hi's counter: 102
    lo = [FakeRequest(f"lo-{i}", "lo", prompt=10, max_tokens=1, priority=1) for i in range(3)]
    hi = [FakeRequest(f"hi-{i}", "pro/hi", prompt=10, max_tokens=1) for i in range(1, 3)]  # priority 0
    free = FakeRequest("free-0", "free/bob", prompt=1, max_tokens=1)  # names 0 (vLLM's default): not allowed
    for r in (*lo, free, *hi):
        s.add_request(r)
    assert free.priority == 1 and [r.priority for r in lo] == [1, 1, 1]  # what vLLM's preemption reads
    order = run(s)
    # pro/hi has the highest counter, and is served first: the better level. At level 0, free/bob's counter (0)
    # would have put it first
    assert order[:2] == ["hi-1", "hi-2"] and set(order[2:]) == {"free-0", "lo-0", "lo-1", "lo-2"}, order


def test_a_tenant_that_cannot_be_one_fails_its_request(classes):
    vtc, _ = classes
    s = vtc(config(True, max_running=2))
    s.add_request(FakeRequest("ok-0", "org/team", prompt=5, max_tokens=1))
    bad = [FakeRequest("bad-0", "org", max_tokens=1), FakeRequest("bad-1", "org/team/x"), FakeRequest("bad-2", "a//b")]
    for r in bad:
        s.add_request(r)
    assert s.grammar_compile_error_reqs == {"bad-0", "bad-1", "bad-2"} and len(s.waiting) == 1
    done = step(s)
    assert set(done[0]) == {"ok-0", "bad-0", "bad-1", "bad-2"}
    assert all(r.status == Status.FINISHED_ERROR for r in bad) and not s.requests
    view = s.fairserve.engine_queue.view()
    assert set(view.tenants) == {"org/team"} and view.groups["org"].service == 5 + 2


# ---- the real thing, where vLLM is installed ---------------------------------------------------------------------
def test_real_vllm_subclass():
    pytest.importorskip("vllm")
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.request_queue import RequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler

    from fairserve.engines import vllm_scheduler

    vtc, sync = vllm_scheduler.VTCScheduler, vllm_scheduler.VTCSyncScheduler
    assert issubclass(vtc, AsyncScheduler) and issubclass(sync, Scheduler) and not issubclass(sync, AsyncScheduler)
    assert issubclass(VTCRequestQueue, RequestQueue)
    missing = {m for m in RequestQueue.__abstractmethods__ if not hasattr(VTCRequestQueue, m)}
    assert not missing
    for name in ("update_from_output", "_free_request", "add_request", "finish_requests"):
        assert hasattr(Scheduler, name)
    assert pickle.loads(pickle.dumps(vtc)) is vtc
    q = make_queue()
    assert isinstance(q, RequestQueue)
