"""fairserve's vLLM scheduler subclass over fakes of vLLM 0.33's Scheduler and AsyncScheduler; and, where vLLM is
installed, the real classes."""

from __future__ import annotations

import pickle
from collections import deque
from types import SimpleNamespace

import pytest
from support.vllm_fakes import FakeRequest, Status, make_queue

from fairserve.engines.vllm_scheduler import SCHEDULER_PATH, VTCRequestQueue, scheduler_classes


# ---- the scheduler subclass over fakes of vLLM's Scheduler and AsyncScheduler -----------------------------------
class FakeScheduler:
    """The parts of vllm.v1.core.sched.scheduler.Scheduler (0.33) the subclass hooks into, reduced to one
    request per slot and one token per decode step."""

    def __init__(
        self, vllm_config, kv_cache_config=None, structured_output_manager=None, block_size=16, **kwargs
    ) -> None:
        self.vllm_config = vllm_config
        self.waiting: deque = deque()  # stands in for FCFSRequestQueue; replaced by the subclass
        self.running: list = []
        self.requests: dict = {}
        self.max_running = vllm_config.max_running
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
        while self.waiting and len(self.running) < self.max_running:
            if self.waiting.peek_request().request_id in self.zero_tokens:
                if not self.skips_zero_token_head:
                    break
                skipped.appendleft(self.waiting.pop_request())  # 0.33's skip_request
                continue
            r = self.waiting.pop_request()
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
        return {0: [r.request_id for r in done]}

    def finish_requests(self, request_ids, status) -> None:
        for rid in request_ids:
            r = self.requests[rid]
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


def config(async_scheduling: bool | None, max_running: int = 1) -> SimpleNamespace:
    return SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=async_scheduling), max_running=max_running)


def step(s, tokens: int = 1) -> dict:
    out = s.schedule()
    sampled = {rid: [0] * tokens for rid in out.num_scheduled_tokens}
    return s.update_from_output(out, SimpleNamespace(sampled=sampled))


@pytest.fixture
def classes(monkeypatch):
    monkeypatch.setenv("FAIRSERVE_POLICY", "vtc")
    monkeypatch.delenv("FAIRSERVE_WEIGHTS", raising=False)
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
