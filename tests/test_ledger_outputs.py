"""Ledger.outputs, the bulk charge the simulator makes when a decision reads a tenant's counter: the same as
output() for each request where charges are exact, only beyond a prediction, taken back exactly, one tenant."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core import Ledger, make_policy
from fairserve.core.request import Request

pytestmark = pytest.mark.unit


def running(ledger, tenant, n, predicted=None):
    reqs = []
    for i in range(n):
        ledger.arrive(f"{tenant}{i}", tenant, 10, max_tokens=50)
    for _ in range(n):
        req = ledger.pop()
        if predicted is not None:
            req.predicted = predicted
        reqs.append(req)
    return reqs


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 4),
    st.lists(st.integers(0, 30), min_size=1, max_size=6),
    st.sampled_from(["vtc", "fcfs"]),
    st.sampled_from(["linear", "profiled"]),
)
def test_one_charge_for_many_equals_many_charges(n, steps, policy, cost):
    bulk, each = (Ledger(make_policy(policy, cost=cost), weights={"a": 2.0}) for _ in range(2))
    a, b = running(bulk, "a", n), running(each, "a", n)
    # NOTE: a profiled cost's charges are not exact in floating point: one sum may differ from many in the last bit
    same = (lambda x: x) if cost == "linear" else (lambda x: pytest.approx(x, rel=1e-12))
    for k in steps:
        bulk.outputs(a, k)
        for r in b:
            each.output(r, k)
        assert bulk.service == same(each.service) and bulk.counters == same(each.counters)
        assert [r.output_done for r in a] == [r.output_done for r in b]
        assert [r.charged for r in a] == same([r.charged for r in b])


def test_only_tokens_beyond_a_prediction_are_charged_and_a_negative_count_takes_them_back():
    ledger = Ledger(make_policy("vtc"))
    reqs = running(ledger, "a", 2, predicted=5)
    before = ledger.service["a"]
    ledger.outputs(reqs, 4)
    assert ledger.service["a"] == before  # still within the prediction
    ledger.outputs(reqs, 3)
    assert ledger.service["a"] == before + 2 * 2 * 2  # 2 tokens beyond 5, each w_q = 2, two requests
    counter = ledger.counters["a"]
    ledger.outputs(reqs, 6)
    ledger.outputs(reqs, -6)
    assert ledger.service["a"] == before + 8 and ledger.counters["a"] == counter
    assert [r.output_done for r in reqs] == [7, 7]


def test_one_tenant_at_a_time_and_settled_requests_are_left_alone():
    ledger = Ledger(make_policy("vtc"))
    a, b = running(ledger, "a", 1)[0], running(ledger, "b", 1)[0]
    with pytest.raises(ValueError, match="one tenant"):
        ledger.outputs([a, b], 1)
    ledger.settle(a)
    done = ledger.service["a"]
    ledger.outputs([a], 5)
    queued = Request(id="q", tenant="a", prompt_tokens=1)
    ledger.add(queued)
    ledger.outputs([queued], 5)
    assert ledger.service["a"] == done and a.output_done == 0 and queued.output_done == 0
