"""Gateway + emulator + bench together, on loopback, on a time-scaled `overload`: the fairness of the paper through
real HTTP, streamed tokens and the one scheduling core."""

import numpy as np
import pytest
from support.processes import serve

from fairserve.bench import run_bench
from fairserve.metrics import backlogged, service_curves, time_grid
from fairserve.workloads import get_workload

pytestmark = pytest.mark.integration

SCALE = 20.0  # simulated seconds per wall second
SECONDS = 40.0  # of workload


@pytest.fixture(scope="module")
def emulator():
    """One emulator for the module: each test drains it (every request finishes) before the next."""
    with serve("emulate", "--time-scale", str(SCALE)) as url:
        yield url


def bench_through_gateway(emulator, workload, policy, weights=None):
    clients = sorted({a.client for a in workload.arrivals})
    keys = {c: f"key-{c}" for c in clients}
    tenants = [f"{c}:{keys[c]}:{(weights or {}).get(c, 1.0)}" for c in clients]
    # NOTE: the backend's in-flight cap is about the engine's batch, so requests wait in the gateway's queue
    with serve(
        "gateway", "--policy", policy, "--backend", f"{emulator},max_requests=20", *(f"--tenant={t}" for t in tenants)
    ) as gateway:
        return run_bench(gateway, workload.arrivals, keys, time_scale=SCALE, timeout_s=120)


def service_while_all_backlogged(records, end_s, weights=None):
    times = time_grid(end_s)
    curves, busy = service_curves(records, times), backlogged(records, times)
    idx = np.logical_and.reduce(list(busy.values())).nonzero()[0]
    assert len(idx) > 10, "the clients should be backlogged together for a while"
    a, b = idx[0], idx[-1]
    return {c: (curves[c][b] - curves[c][a]) / (weights or {}).get(c, 1.0) for c in sorted(curves)}


@pytest.fixture(scope="module")
def overload():
    return get_workload("overload", duration_s=SECONDS)


def test_vtc_gateway_moves_service_towards_equal_through_http(emulator, overload):
    """The wiring, through real HTTP on the wall clock: the tenants reach the policy and the fast sender's share
    moves from FCFS's towards equal. NOTE: the bound itself (Theorem 4.4) is proven where the test owns the clock,
    on the gateway's own scheduler and dispatch (tests/test_gateway_fair_clock.py, with FCFS as the negative
    control): here the replay falls behind on a loaded machine and the difference drifts (11,000 to 20,000 measured
    idle, 32,865 at a load of 10), so it is not asserted."""
    records = run_and_check(emulator, overload, "vtc")
    share = service_while_all_backlogged(records, max(r.finish_s or 0 for r in records))
    # NOTE: through a gateway that keeps 20 requests in flight, the slower sender's queue empties now and then and the
    # counter lift takes its idle credit, so equality is looser than inside the engine (1.2 to 1.45; 1.64 on a loaded
    # machine); FCFS gives 2.0 to 2.05
    assert share["client-1"] / share["client-0"] < 1.75


def test_fcfs_gateway_gives_the_fast_sender_twice(emulator, overload):
    records = run_and_check(emulator, overload, "fcfs")
    share = service_while_all_backlogged(records, max(r.finish_s or 0 for r in records))
    assert share["client-1"] / share["client-0"] > 1.85  # fails the VTC test's < 1.75


def test_weighted_tenants_split_1_2_3_4(emulator):
    w = get_workload("overload-weighted", duration_s=SECONDS)
    records = run_and_check(emulator, w, "vtc", w.weights)
    share = service_while_all_backlogged(records, max(r.finish_s or 0 for r in records), w.weights)
    base = share["client-0"]
    for _c, s in share.items():
        assert s / base == pytest.approx(1.0, abs=0.35), share


def run_and_check(emulator, workload, policy, weights=None):
    records = bench_through_gateway(emulator, workload, policy, weights)
    assert len(records) == len(workload.arrivals)
    assert all(r.status == "finished" for r in records), {r.status for r in records}
    assert all(r.output_tokens == r.max_tokens for r in records)
    return records
