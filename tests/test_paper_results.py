"""The paper's qualitative results on its synthetic workloads (§5.2)."""

import pytest

from fairserve.core import theorem_bound
from fairserve.metrics import backlogged, service_curves, summarize, time_grid
from fairserve.sim import simulate
from fairserve.workloads import make_workload

pytestmark = pytest.mark.unit


def service_while_all_backlogged(workload, policy):
    res = simulate(workload, policy)
    times = time_grid(workload.duration_s)
    curves = service_curves(res.records, times)
    busy = backlogged(res.records, times)
    both = sum(b.astype(int) for b in busy.values()) == len(busy)
    idx = both.nonzero()[0]
    assert len(idx) > 0.5 * len(times), "clients should be backlogged most of the run"
    a, b = idx[0], idx[-1]
    return {c: curves[c][b] - curves[c][a] for c in sorted(curves)}


def test_overload_vtc_equal_service_fcfs_two_to_one():
    w = make_workload("overload")
    vtc = service_while_all_backlogged(w, "vtc")
    # The guarantee is absolute (|difference| <= 2U = 40,000); over ~200,000 of service each that allows a ratio of
    # 1.2. Observed: 1.034, a difference of ~6,700; asserted: within U and 5%.
    assert abs(vtc["client-1"] - vtc["client-0"]) <= 20_000
    assert vtc["client-1"] / vtc["client-0"] == pytest.approx(1.0, abs=0.05)
    fcfs = service_while_all_backlogged(w, "fcfs")
    assert fcfs["client-1"] / fcfs["client-0"] == pytest.approx(2.0, abs=0.1)


def test_overload_weighted_splits_1_2_3_4():
    w = make_workload("overload-weighted")
    assert w.weights == {"client-0": 1, "client-1": 2, "client-2": 3, "client-3": 4}
    res = simulate(w, "vtc")
    s = summarize(res.records, w.duration_s, weights=w.weights)
    base = s.clients["client-0"].service
    for i, c in enumerate(sorted(s.clients)):
        assert s.clients[c].service / base == pytest.approx(i + 1, rel=0.05)
    plain = summarize(simulate(w, "vtc", weights={}).records, w.duration_s)
    shares = [plain.clients[c].service for c in sorted(plain.clients)]
    assert max(shares) / min(shares) == pytest.approx(1.0, abs=0.05)


def test_vtc_difference_stays_within_bound_on_overload_fcfs_grows():
    w = make_workload("overload")
    bound = theorem_bound(256, 10_000)
    vtc = summarize(simulate(w, "vtc").records, w.duration_s)
    fcfs = summarize(simulate(w, "fcfs").records, w.duration_s)
    assert vtc.max_backlogged_diff <= bound
    assert fcfs.max_backlogged_diff > 3 * bound
    assert vtc.jain_index > 0.99 > fcfs.jain_index
