"""The vLLM integration against small fakes of vLLM's Request and scheduler (vLLM itself is CUDA-only)."""
from __future__ import annotations

import enum
import pickle
from collections import deque
from types import SimpleNamespace

import pytest

from fairserve.core import VTC
from fairserve.engines.queue import DEFAULT_CLIENT
from fairserve.engines.vllm_scheduler import (
    CLIENT_ARG,
    SCHEDULER_PATH,
    VTCConfig,
    VTCRequestQueue,
    client_of_request,
    prefilled_tokens,
    scheduler_classes,
)


class Status(enum.IntEnum):       # the names vLLM's RequestStatus uses
    WAITING = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7


class FakeRequest:
    """The fields of vllm.v1.request.Request the integration reads."""

    def __init__(self, rid: str, client: str | None = None, prompt: int = 10, max_tokens: int = 4,
                 extra_args: dict | None = None) -> None:
        self.request_id = rid
        args = dict(extra_args or {})
        if client is not None:
            args[CLIENT_ARG] = client
        self.sampling_params = SimpleNamespace(extra_args=args or None, max_tokens=max_tokens)
        self.num_prompt_tokens = prompt
        self.max_tokens = max_tokens
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.arrival_time = 0.0
        self.status = Status.WAITING
        self._output_token_ids: list[int] = []

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def is_finished(self) -> bool:
        return self.status >= Status.FINISHED_STOPPED

    def __repr__(self) -> str:
        return f"<{self.request_id}>"


def make_queue(**config) -> VTCRequestQueue:
    return VTCRequestQueue.from_config(VTCConfig(**config))


def service(q: VTCRequestQueue) -> dict[str, float]:
    return dict(q.policy.service)


def drain_order(q: VTCRequestQueue, n: int) -> list[str]:
    """Admit n requests, each producing its max_tokens and finishing before the next admission."""
    order = []
    for _ in range(n):
        r = q.pop_request()
        r._output_token_ids.extend(range(r.max_tokens))
        q.charge_outputs([r])
        r.status = Status.FINISHED_STOPPED
        q.settle(r)
        order.append(r.request_id.split("-")[0])
    return order


# ---- the queue alone --------------------------------------------------------------------------------------------
def test_vtc_order_alternates_by_counter_heavy_gets_fewer_admissions():
    q = make_queue()
    for i in range(6):
        q.add_request(FakeRequest(f"heavy-{i}", "heavy", prompt=20, max_tokens=5))   # costs 20 + 2*5 = 30
        q.add_request(FakeRequest(f"light-{i}", "light", prompt=5, max_tokens=5))    # costs  5 + 2*5 = 15
    assert len(q) == 12 and q
    order = drain_order(q, 9)
    # counters after each admission decide: light is admitted twice per heavy admission
    assert order == ["heavy", "light", "light", "heavy", "light", "light", "heavy", "light", "light"]
    assert service(q) == {"heavy": 90.0, "light": 90.0}


def test_equal_clients_alternate_and_peek_matches_pop():
    q = make_queue()
    for i in range(3):
        q.add_request(FakeRequest(f"a-{i}", "a"))
        q.add_request(FakeRequest(f"b-{i}", "b"))
    seen = []
    while q:
        head = q.peek_request()
        assert q.pop_request() is head
        seen.append(head.request_id)
    assert seen == ["a-0", "b-0", "a-1", "b-1", "a-2", "b-2"]
    with pytest.raises(IndexError):
        q.peek_request()
    with pytest.raises(IndexError):
        q.pop_request()


def test_counter_lift_on_arrival():
    q = make_queue()
    for i in range(3):
        q.add_request(FakeRequest(f"a-{i}", "a", prompt=100))
    q.pop_request()
    q.pop_request()                       # a's counter: 200, a still backlogged
    q.add_request(FakeRequest("b-0", "b", prompt=1))
    assert q.policy.counters["b"] == pytest.approx(200.0)   # lifted to the backlogged minimum, not 0
    assert q.policy.service["b"] == 0.0


def test_prompt_charged_once_at_admission_not_at_arrival():
    q = make_queue(w_p=1.5, w_q=2.0)
    r = FakeRequest("a-0", "a", prompt=10)
    q.add_request(r)
    assert service(q) == {"a": 0.0}
    assert q.pop_request() is r
    assert service(q) == {"a": 15.0}
    q.charge_outputs([r])                 # nothing produced yet: nothing more
    assert service(q) == {"a": 15.0}


def test_output_tokens_charged_per_produced_token():
    q = make_queue()
    r = FakeRequest("a-0", "a", prompt=10, max_tokens=8)
    q.add_request(r)
    q.pop_request()
    r._output_token_ids += [1]
    q.charge_outputs([r])
    assert service(q)["a"] == 10 + 2 * 1
    r._output_token_ids += [2, 3, 4]       # a spec-decode step: three accepted tokens
    q.charge_outputs([r, None])
    assert service(q)["a"] == 10 + 2 * 4
    q.charge_outputs([r])                 # the same tokens are not charged twice
    assert service(q)["a"] == 10 + 2 * 4
    r.status = Status.FINISHED_STOPPED
    q.settle(r)
    assert service(q)["a"] == 10 + 2 * 4
    assert q.accounts()["a"].running == 0


def test_preemption_is_not_recharged_nor_lifted_and_resumes_first():
    q = make_queue()
    a0, a1 = FakeRequest("a-0", "a", prompt=10), FakeRequest("a-1", "a", prompt=10)
    b0 = FakeRequest("b-0", "b", prompt=50)
    for r in (a0, a1, b0):
        q.add_request(r)
    assert q.pop_request() is a0          # a: 10
    a0._output_token_ids += [7, 7]
    q.charge_outputs([a0])                # a: 14
    assert q.pop_request() is b0          # b: 50
    # vLLM preempts a-0: status PREEMPTED, computed tokens reset, back to the front of the waiting queue
    a0.status, a0.num_computed_tokens, a0.num_preemptions = Status.PREEMPTED, 0, 1
    q.prepend_request(a0)
    assert len(q) == 2 and q.accounts()["a"].queued == 2
    assert q.policy.counters == {"a": 14.0, "b": 50.0}      # no lift for a (it is behind b) and no charge
    assert q.pop_request() is a0                           # ahead of a-1: it was first
    assert service(q) == {"a": 14.0, "b": 50.0}            # re-prefill is not charged again
    a0._output_token_ids += [7]
    q.charge_outputs([a0])
    assert service(q)["a"] == 16.0


def test_prepend_requests_keeps_the_skipped_requests_order():
    q = make_queue()
    reqs = [FakeRequest(f"a-{i}", "a") for i in range(3)]
    for r in reqs:
        q.add_request(r)
    skipped: deque = deque()
    for _ in range(2):                    # vLLM 0.33 skip_request: pop, appendleft to a step-local deque
        skipped.appendleft(q.pop_request())
    q.prepend_requests(skipped)
    assert [q.pop_request().request_id for _ in range(3)] == ["a-0", "a-1", "a-2"]
    assert service(q)["a"] == 30.0        # skipped requests are not charged twice


def test_abort_queued_request_is_not_charged():
    q = make_queue()
    a0, a1 = FakeRequest("a-0", "a"), FakeRequest("a-1", "a")
    q.add_request(a0)
    q.add_request(a1)
    q.remove_requests([a1, FakeRequest("elsewhere", "a")])  # unknown ones (e.g. in kv_holding_waiting) ignored
    a1.status = Status.FINISHED_ABORTED
    q.settle(a1)
    assert len(q) == 1 and q.peek_request() is a0
    assert service(q) == {"a": 0.0}
    q.remove_request(a0)
    assert not q and len(q) == 0 and list(q) == []


def test_abort_running_charges_only_what_was_done():
    q = make_queue()
    r = FakeRequest("a-0", "a", prompt=100)
    q.add_request(r)
    q.pop_request()
    r.num_computed_tokens = 40            # chunked prefill: 40 of 100 prompt tokens were computed
    r.status = Status.FINISHED_ABORTED
    q.settle(r)
    assert service(q) == {"a": 40.0}

    r2 = FakeRequest("a-1", "a", prompt=100)
    q.add_request(r2)
    q.pop_request()
    r2.num_computed_tokens = 103
    r2._output_token_ids += [1, 2, 3]
    r2.status = Status.FINISHED_ABORTED   # aborted before update_from_output charged these: settle reconciles
    q.settle(r2)
    assert service(q) == {"a": 40.0 + 100 + 6}
    assert q.engine_queue.request("a-1") is None
    q.settle(r2)                          # freeing twice does not charge twice
    assert service(q) == {"a": 146.0}


def test_preempted_then_aborted_keeps_its_prompt_charge():
    q = make_queue()
    r = FakeRequest("a-0", "a", prompt=100)
    q.add_request(r)
    q.pop_request()
    r._output_token_ids += [1, 2]
    r.status, r.num_computed_tokens, r.num_preemptions = Status.PREEMPTED, 0, 1
    q.prepend_request(r)
    q.remove_requests([r])                # vLLM's finish_requests on a waiting request
    assert prefilled_tokens(r) is None
    assert service(q) == {"a": 104.0} and not q


def test_weights_one_to_two():
    q = make_queue(weights={"a": 1.0, "b": 2.0})
    for i in range(9):
        q.add_request(FakeRequest(f"a-{i}", "a", prompt=10, max_tokens=0))
        q.add_request(FakeRequest(f"b-{i}", "b", prompt=10, max_tokens=0))
    order = drain_order(q, 9)
    assert order.count("b") == 6 and order.count("a") == 3
    assert q.policy.counters["a"] == pytest.approx(q.policy.counters["b"])


def test_client_identification():
    assert client_of_request(FakeRequest("x", "alice")) == "alice"
    assert client_of_request(FakeRequest("x", extra_args={"fairserve_client": 7})) == "7"
    assert client_of_request(FakeRequest("x", extra_args={"other": 1})) == DEFAULT_CLIENT
    assert client_of_request(FakeRequest("x")) == DEFAULT_CLIENT
    assert client_of_request(FakeRequest("bob::cmpl-1")) == "bob"              # id carries it
    assert client_of_request(FakeRequest("bob::cmpl-1", "alice")) == "alice"   # extra_args wins
    assert client_of_request(FakeRequest("x", extra_args={"tenant": "t1"}), key="tenant") == "t1"
    no_params = FakeRequest("x")
    no_params.sampling_params = None                                           # pooling requests
    assert client_of_request(no_params) == DEFAULT_CLIENT

    q = make_queue()
    q.add_request(FakeRequest("r1"))
    q.add_request(FakeRequest("r2", "alice"))
    assert set(q.accounts()) == {DEFAULT_CLIENT, "alice"}


def test_known_request_added_again_is_a_requeue_and_unknown_prepend_is_an_arrival():
    q = make_queue()
    r = FakeRequest("a-0", "a")
    q.add_request(r)
    q.pop_request()
    q.add_request(r)                      # a streaming session's next turn re-enters the waiting queue
    assert len(q) == 1 and service(q) == {"a": 10.0}
    other = FakeRequest("b-0", "b")
    q.prepend_request(other)              # never seen: it still must be scheduled
    assert len(q) == 2 and q.accounts()["b"].queued == 1


def test_streaming_session_turns_are_charged_not_refunded():
    """vLLM 0.33's `_update_request_as_session`: the next turn clears the outputs and grows the prompt (history +
    new input). Earlier turns' outputs stay charged; the grown prompt is charged like a chat turn's history."""
    q = make_queue()
    r = FakeRequest("s-0", "a", prompt=10)
    q.add_request(r)
    q.pop_request()
    r._output_token_ids = list(range(100))
    q.charge_outputs([r])
    assert service(q) == {"a": 10 + 2 * 100}
    r._output_token_ids, r.num_prompt_tokens = [], 10 + 100 + 10      # the next turn
    q.charge_outputs([r])
    assert service(q) == {"a": 120 + 2 * 100}
    r._output_token_ids = list(range(10))
    q.charge_outputs([r])
    r.status = Status.FINISHED_STOPPED
    q.settle(r)
    assert service(q) == {"a": 120 + 2 * 110}


def test_config_from_env():
    cfg = VTCConfig.from_env({"FAIRSERVE_POLICY": "weighted-vtc", "FAIRSERVE_WEIGHTS": "a=1, b=2",
                              "FAIRSERVE_WP": "0.5", "FAIRSERVE_WQ": "3", "FAIRSERVE_CLIENT_KEY": "tenant"})
    assert cfg == VTCConfig("weighted-vtc", {"a": 1.0, "b": 2.0}, 0.5, 3.0, None, "tenant")
    policy = cfg.make_policy()
    assert isinstance(policy, VTC) and policy.weight("b") == 2.0
    assert policy.cost.prompt(10) == 5.0 and policy.cost.output(10, 0, 1) == 3.0
    assert VTCConfig.from_env({}) == VTCConfig()
    assert VTCConfig.from_env({"FAIRSERVE_POLICY": "fcfs"}).make_policy().name == "fcfs"
    for bad in ({"FAIRSERVE_WEIGHTS": "a=0"}, {"FAIRSERVE_WP": "-1"}, {"FAIRSERVE_WQ": "many"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            VTCConfig.from_env(bad)
    with pytest.raises(ValueError, match="unknown policy"):
        VTCConfig.from_env({"FAIRSERVE_POLICY": "nope"}).make_policy()
    with pytest.raises(ValueError, match="rejects requests"):
        VTCConfig.from_env({"FAIRSERVE_POLICY": "rpm:5"}).make_policy()


# ---- the scheduler subclass over fakes of vLLM's Scheduler and AsyncScheduler -----------------------------------
class FakeScheduler:
    """The parts of vllm.v1.core.sched.scheduler.Scheduler (0.33) the subclass hooks into, reduced to one
    request per slot and one token per decode step."""

    def __init__(self, vllm_config, kv_cache_config=None, structured_output_manager=None, block_size=16,
                 **kwargs) -> None:
        self.vllm_config = vllm_config
        self.waiting: deque = deque()    # stands in for FCFSRequestQueue; replaced by the subclass
        self.running: list = []
        self.requests: dict = {}
        self.max_running = vllm_config.max_running

    def add_request(self, request) -> None:
        self.waiting.add_request(request)
        self.requests[request.request_id] = request

    def schedule(self) -> SimpleNamespace:
        scheduled = {}
        for r in self.running:
            scheduled[r.request_id] = 1
        while self.waiting and len(self.running) < self.max_running:
            r = self.waiting.pop_request()
            self.running.append(r)
            scheduled[r.request_id] = r.num_prompt_tokens - r.num_computed_tokens
            r.num_computed_tokens = r.num_prompt_tokens
            r.status = Status.RUNNING
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
    return SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
                           max_running=max_running)


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
    assert type(vtc(config(None))) is vtc           # unresolved: vLLM's default is async
    s2 = vtc(vllm_config=config(False), kv_cache_config=None, block_size=16)   # as vLLM's EngineCore calls it
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
    assert admitted == ["h-0", "l-0", "l-1", "h-1"]   # light's counter stays below heavy's after h-0
    acc = s.fairserve_accounts()
    assert acc["heavy"].service == 2 * (40 + 2 * 3) and acc["light"].service == 2 * (4 + 2 * 3)
    assert acc["heavy"].running == acc["light"].running == 0 and not s.requests


def test_scheduler_preemption_and_abort(classes):
    vtc, _ = classes
    s = vtc(config(False, max_running=2))
    a, b = FakeRequest("a-0", "a", prompt=10, max_tokens=9), FakeRequest("b-0", "b", prompt=10, max_tokens=9)
    s.add_request(a)
    s.add_request(b)
    step(s)                                    # both admitted, one token each
    assert s.fairserve.policy.service == {"a": 12.0, "b": 12.0}
    s.preempt_last()                           # b goes back, keeps its charge
    step(s)                                    # b re-admitted (re-prefill not charged), both decode
    assert s.fairserve.policy.service == {"a": 14.0, "b": 14.0}
    s.finish_requests(["b-0"], Status.FINISHED_ABORTED)
    assert s.fairserve.policy.service["b"] == 14.0 and s.fairserve.engine_queue.request("b-0") is None
    s.add_request(c := FakeRequest("c-0", "c", prompt=30))
    s.add_request(FakeRequest("c-1", "c", prompt=30))
    step(s)                                    # c-0 admitted into b's slot; c-1 waits
    s.finish_requests(["c-1"], Status.FINISHED_ABORTED)
    assert s.fairserve.policy.service["c"] == 30 + 2 * 1 and not s.waiting
    assert c.status == Status.RUNNING


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
