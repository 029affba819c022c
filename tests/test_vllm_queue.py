"""fairserve's vLLM waiting queue (`VTCRequestQueue`) on its own: order, lift, charges, preemption, aborts, sessions,
configuration."""

from __future__ import annotations

from collections import deque

import pytest
from support.vllm_fakes import FakeRequest, Status, make_queue, service

from fairserve.core import DEFAULT_TENANT, VTC
from fairserve.engines import vllm_queue
from fairserve.engines.vllm_lora import lora_id
from fairserve.engines.vllm_scheduler import VTCConfig, VTCRequestQueue, prefilled_tokens, tenant_of_request
from fairserve.engines.vllm_tenants import MAX_DEPTH, parse_sources, path_problem

pytestmark = pytest.mark.unit


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
    assert tenant_of_request(FakeRequest("x", "alice")) == "alice"
    assert tenant_of_request(FakeRequest("x", extra_args={"fairserve_client": 7})) == "7"
    assert tenant_of_request(FakeRequest("x", extra_args={"other": 1})) == DEFAULT_TENANT
    assert tenant_of_request(FakeRequest("x")) == DEFAULT_TENANT
    assert tenant_of_request(FakeRequest("bob::cmpl-1")) == "bob"  # id carries it
    assert tenant_of_request(FakeRequest("bob::cmpl-1", "alice")) == "alice"  # extra_args wins
    assert tenant_of_request(FakeRequest("x", extra_args={"tenant": "t1"}), key="tenant") == "t1"
    no_params = FakeRequest("x")
    no_params.sampling_params = None  # pooling requests
    assert tenant_of_request(no_params) == DEFAULT_TENANT

    q = make_queue()
    q.add_request(FakeRequest("r1"))
    q.add_request(FakeRequest("r2", "alice"))
    assert set(q.accounts()) == {DEFAULT_TENANT, "alice"}


def test_tenant_sources_in_order_the_adapter_by_default_after_xargs():
    named = FakeRequest("bob::1", "alice", lora=("sql", 3))
    adapter = FakeRequest("bob::2", lora=("sql", 3))
    assert [tenant_of_request(r) for r in (named, adapter, FakeRequest("bob::3"))] == ["alice", "sql", "bob"]
    assert tenant_of_request(FakeRequest("x", lora=(" ", 3))) == DEFAULT_TENANT  # a blank name names nothing
    lora_first = parse_sources("lora, xargs", "FAIRSERVE_TENANT_FROM")
    assert lora_first == ("lora", "xargs") and parse_sources("", "X") == ("xargs", "lora", "id")
    assert tenant_of_request(named, sources=lora_first) == "sql"
    assert tenant_of_request(FakeRequest("bob::4"), sources=lora_first) == DEFAULT_TENANT  # ids not asked
    for bad in ("xargs,header", "id,id", "lora,"):
        with pytest.raises(ValueError, match="FAIRSERVE_TENANT_FROM"):
            parse_sources(bad, "FAIRSERVE_TENANT_FROM")
    assert lora_id(adapter) == 3 and lora_id(named) == 3 and lora_id(FakeRequest("x")) == 0


def test_tenant_paths_give_each_group_its_share():
    q = make_queue()
    for i in range(6):
        for user in ("u1", "u2", "u3"):
            q.add_request(FakeRequest(f"big/{user}-{i}", f"big/{user}", prompt=10, max_tokens=0))
        q.add_request(FakeRequest(f"small/u1-{i}", "small/u1", prompt=10, max_tokens=0))
    order = drain_order(q, 12)  # "big/u1-0" -> "big/u1"
    assert order.count("small/u1") == 6, order  # half of the service, against three users in the other group
    view = q.engine_queue.view()
    assert view.groups["big"].service == view.groups["small"].service == 60.0


def test_a_request_runs_at_the_priority_it_names_only_if_its_tenant_allows_it():
    q = make_queue(priorities={"free": 1}, allowed={"pro/a": frozenset({0, 2})})
    x = FakeRequest("x", "pro/a", priority=2)  # allowed: runs at 2
    y = FakeRequest("y", "pro/a", priority=1)  # not allowed: runs at its own level, 0
    z = FakeRequest("z", "free/b")  # names 0 (vLLM's default): not allowed, runs at its group's 1
    for r in (x, y, z):
        q.add_request(r)
    assert [r.priority for r in (x, y, z)] == [2, 0, 1]  # written back: what vLLM's preemption reads
    assert [q.pop_request().request_id for _ in range(3)] == ["y", "z", "x"]
    y.status, y.num_preemptions = Status.PREEMPTED, 1
    q.prepend_request(y)  # preempted: back at its level, first
    q.add_request(FakeRequest("w", "free/b"))
    assert q.pop_request() is y


def test_a_tenant_that_cannot_be_one_is_queued_as_the_default_tenant_without_a_scheduler():
    q = make_queue()
    q.add_request(FakeRequest("a-0", "org/team"))
    q.add_request(FakeRequest("a-1", "org"))  # a group's name
    q.add_request(FakeRequest("a-2", "a//b"))
    assert set(q.accounts()) == {"org/team", DEFAULT_TENANT} and q.accounts()[DEFAULT_TENANT].queued == 2
    refused: list[str] = []
    q.on_refused = refused.append  # what the scheduler does: vLLM fails them
    q.add_request(FakeRequest("a-3", "org/team/x"))  # through a tenant
    assert refused == ["a-3"] and len(q) == 3
    assert path_problem("a/" * MAX_DEPTH + "a") and path_problem("x" * 300) and path_problem("/a")
    assert path_problem("a/b c/d") is None and path_problem(f"{DEFAULT_TENANT}/x")


# ---- the pass's hold (the LoRA-slot rule) -------------------------------------------------------------------------
def test_held_requests_are_not_shown_and_come_back_in_place_uncharged():
    q = make_queue()
    x, y, z = (FakeRequest(f"t-{n}", "t", lora=(name, i)) for n, (name, i) in enumerate([("a", 1), ("b", 2), ("a", 1)]))
    u = FakeRequest("u-0", "u", lora=("a", 1))
    for r in (x, y, z, u):
        q.add_request(r)
    q.hold_back(lambda r: lora_id(r) == 1)
    assert q and q.peek_request() is y  # x (first) is held back, the policy's order otherwise
    skipped = [q.pop_request()]  # vLLM skips y (say its LoRA gets no slot)
    assert not q and len(q) == 0  # every other request is held: vLLM sees an empty queue
    with pytest.raises(IndexError):
        q.peek_request()
    q.prepend_requests(skipped)
    q.end_pass()
    assert len(q) == 4 and service(q) == {"t": 0.0, "u": 0.0} and q.ledger.counters == {"t": 0.0, "u": 0.0}
    assert [q.pop_request().request_id for _ in range(4)] == ["t-0", "u-0", "t-1", "t-2"]  # as before the pass


def test_the_hold_is_bounded_per_pass_and_a_held_request_can_be_cancelled(monkeypatch):
    monkeypatch.setattr(vllm_queue, "MAX_HELD", 2)
    q = make_queue()
    held = [FakeRequest(f"a-{i}", "a", lora=("a", 1)) for i in range(3)]
    for r in (*held, FakeRequest("base-0", "base")):
        q.add_request(r)
    q.hold_back(lambda r: lora_id(r) == 1)
    assert q.peek_request().request_id == "base-0"  # a-0 is held (its tenant was first), then base's turn
    q.pop_request()
    assert not q  # a-1 held too; a-2 would be the third: the pass ends here
    q.remove_requests([held[0]])  # aborted while held
    q.end_pass()
    assert [r.request_id for r in q] and len(q) == 2 and q.accounts()["a"].running == 0
    assert q.pop_request() is held[1] and service(q)["a"] == 10.0


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


def test_config_of_the_tree_priorities_sources_and_lora_rule():
    cfg = VTCConfig.from_env(
        {
            "FAIRSERVE_WEIGHTS": "pro=3,pro/acme=2",
            "FAIRSERVE_PRIORITIES": "free=1, pro=0",
            "FAIRSERVE_ALLOWED_PRIORITIES": "pro/acme/x=0|1, anonymous=0|1|2",
            "FAIRSERVE_TENANT_FROM": "lora,xargs",
            "FAIRSERVE_LORA_WAIT_STEPS": "5",
        }
    )
    assert cfg.priorities == {"free": 1, "pro": 0} and cfg.allowed == {"pro/acme/x": {0, 1}, "anonymous": {0, 1, 2}}
    assert cfg.tenant_from == ("lora", "xargs") and cfg.lora_wait == 5 and cfg.uses_priorities
    ledger = VTCRequestQueue.from_config(cfg).ledger
    assert ledger.groups["pro"].weight == 3 and ledger.allowed_priorities("anonymous") == {0, 1, 2}
    cfg.check_engine("priority")
    with pytest.raises(ValueError, match="--scheduling-policy priority"):
        cfg.check_engine("fcfs")
    plain = VTCConfig.from_env({})
    assert (
        plain.lora_wait == 32
        and not plain.uses_priorities
        and VTCConfig.from_env({"FAIRSERVE_LORA_WAIT_STEPS": "off"}).lora_wait is None
    )
    plain.check_engine("fcfs")
    bad = {
        "FAIRSERVE_PRIORITIES": "free=high",
        "FAIRSERVE_ALLOWED_PRIORITIES": "a=",
        "FAIRSERVE_TENANT_FROM": "xargs,cookie",
        "FAIRSERVE_LORA_WAIT_STEPS": "-1",
    }
    for name, value in [*bad.items(), ("FAIRSERVE_ALLOWED_PRIORITIES", "a=0|x"), ("FAIRSERVE_LORA_WAIT_STEPS", "soon")]:
        with pytest.raises(ValueError, match=name):
            VTCConfig.from_env({name: value})
    with pytest.raises(ValueError, match="does not order by priority"):
        VTCConfig.from_env({"FAIRSERVE_POLICY": "fcfs", "FAIRSERVE_PRIORITIES": "a=1"})
    conflict = VTCConfig.from_env({"FAIRSERVE_WEIGHTS": "pro/a=2", "FAIRSERVE_ALLOWED_PRIORITIES": "pro=0|1"})
    with pytest.raises(ValueError, match="FAIRSERVE_ALLOWED_PRIORITIES: 'pro' is a group"):
        VTCRequestQueue.from_config(conflict)
