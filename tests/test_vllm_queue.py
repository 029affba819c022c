"""fairserve's vLLM waiting queue (`VTCRequestQueue`) on its own: order, lift, charges, preemption, aborts, sessions,
configuration."""

from __future__ import annotations

from collections import deque

import pytest
from support.vllm_fakes import FakeRequest, Status, make_queue, service

from fairserve.core import DEFAULT_TENANT, VTC
from fairserve.engines.vllm_scheduler import VTCConfig, VTCRequestQueue, client_of_request, prefilled_tokens


def drain_order(q: VTCRequestQueue, n: int) -> list[str]:
    """Admit n requests, each producing its max_tokens and finishing before the next admission."""
    order = []
    for _ in range(n):
        r = q.pop_request()
        r._output_token_ids.extend(range(r.max_tokens))
        q.charge_outputs([r])
        r.status = Status.FINISHED_STOPPED
        q.freed(r)
        order.append(r.request_id.split("-")[0])
    return order


# ---- the queue alone --------------------------------------------------------------------------------------------
def test_vtc_order_alternates_by_counter_heavy_gets_fewer_admissions():
    q = make_queue()
    for i in range(6):
        q.add_request(FakeRequest(f"heavy-{i}", "heavy", prompt=20, max_tokens=5))  # costs 20 + 2*5 = 30
        q.add_request(FakeRequest(f"light-{i}", "light", prompt=5, max_tokens=5))  # costs  5 + 2*5 = 15
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
    q.pop_request()  # a's counter: 200, a still backlogged
    q.add_request(FakeRequest("b-0", "b", prompt=1))
    assert q.ledger.counters["b"] == pytest.approx(200.0)  # lifted to the backlogged minimum, not 0
    assert q.ledger.service["b"] == 0.0


def test_prompt_charged_once_at_admission_not_at_arrival():
    q = make_queue(w_p=1.5, w_q=2.0)
    r = FakeRequest("a-0", "a", prompt=10)
    q.add_request(r)
    assert service(q) == {"a": 0.0}
    assert q.pop_request() is r
    assert service(q) == {"a": 15.0}
    q.charge_outputs([r])  # nothing produced yet: nothing more
    assert service(q) == {"a": 15.0}


def test_output_tokens_charged_per_produced_token():
    q = make_queue()
    r = FakeRequest("a-0", "a", prompt=10, max_tokens=8)
    q.add_request(r)
    q.pop_request()
    r._output_token_ids += [1]
    q.charge_outputs([r])
    assert service(q)["a"] == 10 + 2 * 1
    r._output_token_ids += [2, 3, 4]  # a spec-decode step: three accepted tokens
    q.charge_outputs([r, None])
    assert service(q)["a"] == 10 + 2 * 4
    q.charge_outputs([r])  # the same tokens are not charged twice
    assert service(q)["a"] == 10 + 2 * 4
    r.status = Status.FINISHED_STOPPED
    q.freed(r)
    assert service(q)["a"] == 10 + 2 * 4
    assert q.accounts()["a"].running == 0


def test_preemption_is_not_recharged_nor_lifted_and_resumes_first():
    q = make_queue()
    a0, a1 = FakeRequest("a-0", "a", prompt=10), FakeRequest("a-1", "a", prompt=10)
    b0 = FakeRequest("b-0", "b", prompt=50)
    for r in (a0, a1, b0):
        q.add_request(r)
    assert q.pop_request() is a0  # a: 10
    a0._output_token_ids += [7, 7]
    q.charge_outputs([a0])  # a: 14
    assert q.pop_request() is b0  # b: 50
    # vLLM preempts a-0: status PREEMPTED, computed tokens reset, back to the front of the waiting queue
    a0.status, a0.num_computed_tokens, a0.num_preemptions = Status.PREEMPTED, 0, 1
    q.prepend_request(a0)
    assert len(q) == 2 and q.accounts()["a"].queued == 2
    assert q.ledger.counters == {"a": 14.0, "b": 50.0}  # no lift for a (it is behind b) and no charge
    assert q.pop_request() is a0  # ahead of a-1: it was first
    assert service(q) == {"a": 14.0, "b": 50.0}  # re-prefill is not charged again
    a0._output_token_ids += [7]
    q.charge_outputs([a0])
    assert service(q)["a"] == 16.0


def test_prepend_requests_keeps_the_skipped_requests_order():
    q = make_queue()
    reqs = [FakeRequest(f"a-{i}", "a") for i in range(3)]
    for r in reqs:
        q.add_request(r)
    skipped: deque = deque()
    for _ in range(2):  # vLLM 0.33 skip_request: pop, appendleft to a step-local deque
        skipped.appendleft(q.pop_request())
    q.prepend_requests(skipped)
    assert [q.pop_request().request_id for _ in range(3)] == ["a-0", "a-1", "a-2"]
    assert service(q)["a"] == 30.0  # skipped requests are not charged twice


def test_request_popped_and_put_back_unscheduled_is_not_charged():
    """vLLM's skip_request (0.33 also for a request that gets 0 new tokens): popped, then put back at the end of the
    pass without being scheduled. Charges follow what was scheduled: none, no lift; charged at its next pop."""
    q = make_queue()
    a0, b0 = FakeRequest("a-0", "a", prompt=10), FakeRequest("b-0", "b", prompt=30)
    for r in (a0, b0):
        q.add_request(r)
    skipped: deque = deque([q.pop_request()])  # a-0, charged at the pop
    assert skipped[0] is a0 and service(q)["a"] == 10.0
    assert q.pop_request() is b0  # admitted and scheduled
    b0.status = Status.RUNNING
    q.prepend_requests(skipped)
    q.end_pass()
    assert service(q) == {"a": 0.0, "b": 30.0} and q.ledger.counters["a"] == 0.0
    assert q.accounts()["a"].queued == 1 and q.accounts()["a"].running == 0
    assert q.pop_request() is a0 and service(q)["a"] == 10.0  # charged once, when popped again
    a0.status = Status.RUNNING
    q.end_pass()
    a0._output_token_ids += [1, 2]
    q.charge_outputs([a0])
    a0.status, a0.num_preemptions = Status.PREEMPTED, 1  # preempted later: keeps its charges
    q.prepend_request(a0)
    assert service(q)["a"] == 14.0
    assert q.pop_request() is a0 and service(q)["a"] == 14.0


def test_skipped_twice_then_cancelled_costs_nothing_and_predicted_output_is_charged_once():
    def predicting_queue() -> VTCRequestQueue:  # client a has finished one request of 6 tokens: predicted 6
        q = make_queue(policy="vtc-predict:moving-average")
        q.add_request(done := FakeRequest("a-s", "a", prompt=0, max_tokens=6))
        q.pop_request()
        done._output_token_ids, done.status = [1] * 6, Status.FINISHED_LENGTH_CAPPED
        q.freed(done)
        q.end_pass()
        return q

    once = predicting_queue()
    once.add_request(FakeRequest("a-0", "a", prompt=10, max_tokens=8))
    once.pop_request()
    assert service(once)["a"] == 2 * 6 + 10 + 2 * 6  # the seed, then prompt + the predicted output
    q = predicting_queue()
    r = FakeRequest("a-0", "a", prompt=10, max_tokens=8)
    q.add_request(r)
    for _ in range(2):
        q.prepend_requests([q.pop_request()])
        q.end_pass()
    assert q.pop_request() is r
    charged = service(q)["a"]
    assert charged == service(once)["a"]  # charged once
    q.end_pass()
    r2 = FakeRequest("a-1", "a", prompt=20)
    q.add_request(r2)
    q.prepend_requests([q.pop_request()])  # a-1 skipped, then the client goes away
    q.end_pass()
    q.remove_requests([r2])
    assert service(q)["a"] == charged and len(q) == 0


def test_abort_queued_request_is_not_charged():
    q = make_queue()
    a0, a1 = FakeRequest("a-0", "a"), FakeRequest("a-1", "a")
    q.add_request(a0)
    q.add_request(a1)
    q.remove_requests([a1, FakeRequest("elsewhere", "a")])  # unknown ones (e.g. in kv_holding_waiting) ignored
    a1.status = Status.FINISHED_ABORTED
    q.freed(a1)
    assert len(q) == 1 and q.peek_request() is a0
    assert service(q) == {"a": 0.0}
    q.remove_request(a0)
    assert not q and len(q) == 0 and list(q) == []


def test_abort_running_charges_only_what_was_done():
    q = make_queue()
    r = FakeRequest("a-0", "a", prompt=100)
    q.add_request(r)
    q.pop_request()
    r.num_computed_tokens = 40  # chunked prefill: 40 of 100 prompt tokens were computed
    r.status = Status.FINISHED_ABORTED
    q.freed(r)
    assert service(q) == {"a": 40.0}

    r2 = FakeRequest("a-1", "a", prompt=100)
    q.add_request(r2)
    q.pop_request()
    r2.num_computed_tokens = 103
    r2._output_token_ids += [1, 2, 3]
    r2.status = Status.FINISHED_ABORTED  # aborted before update_from_output charged these: settle reconciles
    q.freed(r2)
    assert service(q) == {"a": 40.0 + 100 + 6}
    assert q.engine_queue.request("a-1") is None
    q.freed(r2)  # freeing twice does not charge twice
    assert service(q) == {"a": 146.0}


def test_preempted_then_aborted_keeps_its_prompt_charge():
    q = make_queue()
    r = FakeRequest("a-0", "a", prompt=100)
    q.add_request(r)
    q.pop_request()
    r._output_token_ids += [1, 2]
    r.status, r.num_computed_tokens, r.num_preemptions = Status.PREEMPTED, 0, 1
    q.prepend_request(r)
    q.remove_requests([r])  # vLLM's finish_requests on a waiting request
    assert prefilled_tokens(r) is None
    assert service(q) == {"a": 104.0} and not q


def test_weights_one_to_two():
    q = make_queue(weights={"a": 1.0, "b": 2.0})
    for i in range(9):
        q.add_request(FakeRequest(f"a-{i}", "a", prompt=10, max_tokens=0))
        q.add_request(FakeRequest(f"b-{i}", "b", prompt=10, max_tokens=0))
    order = drain_order(q, 9)
    assert order.count("b") == 6 and order.count("a") == 3
    assert q.ledger.counters["a"] == pytest.approx(q.ledger.counters["b"])


def test_client_identification():
    assert client_of_request(FakeRequest("x", "alice")) == "alice"
    assert client_of_request(FakeRequest("x", extra_args={"fairserve_client": 7})) == "7"
    assert client_of_request(FakeRequest("x", extra_args={"other": 1})) == DEFAULT_TENANT
    assert client_of_request(FakeRequest("x")) == DEFAULT_TENANT
    assert client_of_request(FakeRequest("bob::cmpl-1")) == "bob"  # id carries it
    assert client_of_request(FakeRequest("bob::cmpl-1", "alice")) == "alice"  # extra_args wins
    assert client_of_request(FakeRequest("x", extra_args={"tenant": "t1"}), key="tenant") == "t1"
    no_params = FakeRequest("x")
    no_params.sampling_params = None  # pooling requests
    assert client_of_request(no_params) == DEFAULT_TENANT

    q = make_queue()
    q.add_request(FakeRequest("r1"))
    q.add_request(FakeRequest("r2", "alice"))
    assert set(q.accounts()) == {DEFAULT_TENANT, "alice"}


def test_known_request_added_again_is_a_requeue_and_unknown_prepend_is_an_arrival():
    q = make_queue()
    r = FakeRequest("a-0", "a")
    q.add_request(r)
    q.pop_request()
    q.add_request(r)  # a streaming session's next turn re-enters the waiting queue
    assert len(q) == 1 and service(q) == {"a": 10.0}
    other = FakeRequest("b-0", "b")
    q.prepend_request(other)  # never seen: it still must be scheduled
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
    r._output_token_ids, r.num_prompt_tokens = [], 10 + 100 + 10  # the next turn
    q.charge_outputs([r])
    assert service(q) == {"a": 120 + 2 * 100}
    r._output_token_ids = list(range(10))
    q.charge_outputs([r])
    r.status = Status.FINISHED_STOPPED
    q.freed(r)
    assert service(q) == {"a": 120 + 2 * 110}


def test_config_from_env():
    cfg = VTCConfig.from_env(
        {
            "FAIRSERVE_POLICY": "weighted-vtc",
            "FAIRSERVE_WEIGHTS": "a=1, b=2",
            "FAIRSERVE_WP": "0.5",
            "FAIRSERVE_WQ": "3",
            "FAIRSERVE_CLIENT_KEY": "tenant",
        }
    )
    assert cfg == VTCConfig("weighted-vtc", {"a": 1.0, "b": 2.0}, 0.5, 3.0, None, "tenant")
    policy = cfg.make_policy()
    assert isinstance(policy, VTC) and VTCRequestQueue.from_config(cfg).ledger.weights["b"] == 2.0
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
