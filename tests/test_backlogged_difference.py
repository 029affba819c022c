"""The run-based metrics against the pairwise, clients x times computations they replace (kept as oracles)."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairserve.core.cost import make_cost
from fairserve.metrics import (
    backlog_runs,
    backlogged,
    backlogged_difference,
    backlogged_jain,
    describe_difference,
    largest_backlogged_difference,
    prepare_curves,
    service_curves,
    summarize,
    time_grid,
    windowed_jain,
)
from fairserve.records import RequestRecord

pytestmark = pytest.mark.unit

HALF = st.integers(0, 80).map(lambda k: k / 2)  # on and between grid points: ties with the grid and each other


@st.composite
def request(draw, client):
    arrival = draw(HALF)
    status = draw(st.sampled_from(["finished", "finished", "unfinished", "rejected"]))
    admit = first = last = None
    if status != "rejected" and draw(st.booleans()):
        admit = arrival + draw(st.sampled_from([0.0, 0.5, 1.0, 3.0, 12.0, 30.0]))
        if draw(st.integers(0, 4)):
            first = admit + draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]))
            last = first + draw(st.sampled_from([0.0, 0.25, 1.0, 4.0, 9.5]))
    if status == "finished" and first is None:
        status = "unfinished"
    out = draw(st.integers(0 if first is None else 1, 40))
    return RequestRecord(
        id=None,
        client=client,
        arrival_s=arrival,
        admit_s=admit,
        first_token_s=first,
        finish_s=last if status == "finished" else None,
        last_token_s=last,
        prompt_tokens=draw(st.integers(1, 60)),
        output_tokens=out,
        max_tokens=max(out, 1),
        status=status,
    )


@st.composite
def workload(draw, max_clients=30):
    n = draw(st.integers(2, max_clients))
    records = []
    for i in range(n):
        for _ in range(draw(st.integers(0 if i > 1 else 1, 5))):
            records.append(draw(request(f"c{i:02d}")))
    weights = draw(
        st.one_of(
            st.none(),
            st.dictionaries(
                st.sampled_from([f"c{i:02d}" for i in range(n)]), st.sampled_from([0.5, 1.0, 2.0, 3.0]), max_size=n
            ),
        )
    )
    return records, weights


def dense_busy(records, times):
    """The definition: arrived at or before t, admitted after t, not rejected."""
    out = {}
    for c in sorted({r.client for r in records}):
        waiting = [r for r in records if r.client == c and r.status != "rejected"]
        arrived = np.sort([r.arrival_s for r in waiting])
        admitted = np.sort([r.admit_s for r in waiting if r.admit_s is not None])
        out[c] = (np.searchsorted(arrived, times, "right") - np.searchsorted(admitted, times, "right")) > 0
    return out


def check_against_oracle(records, weights, cost=None, step=1.0):
    times = time_grid(max(r.arrival_s for r in records) + 45, step)
    curves, busy = service_curves(records, times, cost=cost), dense_busy(records, times)
    _, want, want_pair = backlogged_difference(curves, busy, weights)
    got = largest_backlogged_difference(
        prepare_curves(records, times, cost=cost), backlog_runs(records, times), weights
    )
    assert got.exact and got.upper == got.value
    assert got.value == want  # bit for bit: the same floats, subtracted the same way
    assert got.pair == want_pair  # ties: the first pair in name order, as the oracle keeps
    return times, curves, busy


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload())
def test_largest_difference_equals_the_pairwise_oracle(case):
    check_against_oracle(*case)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload(max_clients=12))
def test_largest_difference_equals_the_oracle_under_a_non_linear_cost_and_a_finer_grid(case):
    check_against_oracle(*case, cost=make_cost("profiled"), step=0.5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload(), st.floats(0, 400))
def test_a_work_limit_gives_a_proven_bracket(case, limit):
    records, weights = case
    times = time_grid(max(r.arrival_s for r in records) + 45)
    _, want, _ = backlogged_difference(service_curves(records, times), dense_busy(records, times), weights)
    got = largest_backlogged_difference(
        prepare_curves(records, times), backlog_runs(records, times), weights, work_limit=limit
    )
    assert got.value <= want <= got.upper
    assert got.exact == (got.value == got.upper) or got.value == got.upper
    if got.exact:
        assert got.value == want


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload())
def test_runs_curves_and_jain_equal_the_dense_versions(case):
    records, weights = case
    times = time_grid(max(r.arrival_s for r in records) + 45)
    busy = dense_busy(records, times)
    assert {c: b.tolist() for c, b in backlogged(records, times).items()} == {c: b.tolist() for c, b in busy.items()}
    curves = service_curves(records, times)
    prepared = prepare_curves(records, times)
    picks = np.arange(len(times))[::3]
    for c, curve in prepared.items():
        assert np.array_equal(curve.at(picks), curves[c][picks])  # any subset reads the same floats
    # NOTE: after a ramp ends, the curve formula's t*Σslope - Σslope*edge leaves float noise (~1e-13) that the dense
    # version reads as service; the run-based one reads only where service happened. Rounded curves drop the noise.
    clean = {c: np.round(v, 6) for c, v in curves.items()}
    for window in (4.0, 10.0, 60.0):
        want = windowed_jain(clean, busy, times, window, weights)
        got = backlogged_jain(prepared, backlog_runs(records, times), times, window, weights)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)  # and the same NaNs


def test_clients_never_backlogged_together_have_no_difference():
    a = [RequestRecord(None, "a", 0, 5, 6, 9, 9, 10, 20, 20, "finished")]
    b = [RequestRecord(None, "b", 10, 15, 16, 19, 19, 10, 20, 20, "finished")]
    times = time_grid(30)
    got = largest_backlogged_difference(prepare_curves(a + b, times), backlog_runs(a + b, times))
    assert (got.value, got.pair, got.exact) == (0.0, None, True)


def test_a_stretch_where_both_gain_counts_the_net_difference():
    # a waits over [0, 20]; b waits over [0, 20] too; a gets 100 in [2, 4], b gets 30 in [10, 12]:
    # the largest difference is a's 100 gained while b got nothing, not 100 - 30
    rs = [
        RequestRecord(None, "a", 0, 1, 2, 4, 4, 0, 51, 51, "finished"),
        RequestRecord(None, "a", 0, 20, None, None, None, 5, 5, 5, "unfinished"),
        RequestRecord(None, "b", 0, 9, 10, 12, 12, 0, 16, 16, "finished"),
        RequestRecord(None, "b", 0, 20, None, None, None, 5, 5, 5, "unfinished"),
    ]
    s = summarize(rs, 25)
    assert s.max_backlogged_diff == pytest.approx(102.0) and s.max_backlogged_diff_pair == ("a", "b")
    assert s.max_backlogged_diff_exact and s.max_backlogged_diff_upper == s.max_backlogged_diff


def test_a_bracket_is_printed_as_an_estimate():
    rs = [RequestRecord(None, c, 0, 1 + i, 2 + i, 4 + i, 4 + i, 0, 51, 51, "finished") for i, c in enumerate("ab")]
    rs += [RequestRecord(None, c, 0, 20, None, None, None, 5, 5, 5, "unfinished") for c in "ab"]
    exact = summarize(rs, 25)
    assert describe_difference(exact) == f"{exact.max_backlogged_diff:,.0f} (a vs b)"
    stopped = replace(exact, max_backlogged_diff=50.0, max_backlogged_diff_upper=120.0, max_backlogged_diff_exact=False)
    assert describe_difference(stopped) == (
        "between 50 (a vs b) and 120 (estimate: the exact search stopped at its work limit)"
    )
