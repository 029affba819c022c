"""Gateway + emulator + bench together, on loopback, on a time-scaled `overload`: the fairness of the paper through
real HTTP, streamed tokens and the one scheduling core."""

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
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
    """The workload's records through a gateway in front of `emulator`, and the gateway's /metrics as it ended."""
    clients = sorted({a.client for a in workload.arrivals})
    keys = {c: f"key-{c}" for c in clients}
    tenants = [f"{c}:{keys[c]}:{(weights or {}).get(c, 1.0)}" for c in clients]
    # NOTE: the backend's in-flight cap is about the engine's batch, so requests wait in the gateway's queue
    with serve(
        "gateway", "--policy", policy, "--backend", f"{emulator},max_requests=20", *(f"--tenant={t}" for t in tenants)
    ) as gateway:
        records = run_bench(gateway, workload.arrivals, keys, time_scale=SCALE, timeout_s=120)
        return records, httpx.get(gateway + "/metrics", timeout=10).text


def service_while_all_backlogged(records, end_s):
    times = time_grid(end_s)
    curves, busy = service_curves(records, times), backlogged(records, times)
    idx = np.logical_and.reduce(list(busy.values())).nonzero()[0]
    assert len(idx) > 10, "the clients should be backlogged together for a while"
    a, b = idx[0], idx[-1]
    return {c: curves[c][b] - curves[c][a] for c in sorted(curves)}


@pytest.fixture(scope="module")
def overload():
    return get_workload("overload", duration_s=SECONDS)


def test_vtc_gateway_moves_service_towards_equal_through_http(emulator, overload):
    """The wiring, through real HTTP on the wall clock: the tenants reach the policy and the fast sender's share
    moves from FCFS's towards equal. NOTE: the bound itself (Theorem 4.4) is proven where the test owns the clock,
    on the gateway's own scheduler and dispatch (tests/test_gateway_fair_clock.py, with FCFS as the negative
    control): here the replay falls behind on a loaded machine and the difference drifts (11,000 to 20,000 measured
    idle, 32,865 at a load of 10), so it is not asserted."""
    records, _ = run_and_check(emulator, overload, "vtc")
    share = service_while_all_backlogged(records, max(r.finish_s or 0 for r in records))
    # NOTE: through a gateway that keeps 20 requests in flight, the slower sender's queue empties now and then and the
    # counter lift takes its idle credit, so equality is looser than inside the engine (1.2 to 1.45; 1.64 on a loaded
    # machine); FCFS gives 2.0 to 2.05
    assert share["client-1"] / share["client-0"] < 1.75


def test_fcfs_gateway_gives_the_fast_sender_twice(emulator, overload):
    records, _ = run_and_check(emulator, overload, "fcfs")
    share = service_while_all_backlogged(records, max(r.finish_s or 0 for r in records))
    assert share["client-1"] / share["client-0"] > 1.85  # fails the VTC test's < 1.75


def test_weighted_tenants_reach_the_ledger_with_their_weights_through_http(emulator):
    """The wiring of weights, through real HTTP: each tenant's weight from `--tenant NAME:KEY:WEIGHT` is the
    ledger's, and each is charged exactly its requests' service. NOTE: the 1:2:3:4 split itself is proven where the
    test owns the clock (tests/test_gateway_fair_clock.py, unweighted as the negative control): on the wall clock a
    loaded machine's replay falls behind and the split drifts (client-0 at weight 1 got the most service per weight
    in one run beside two CPU burners)."""
    w = get_workload("overload-weighted", duration_s=SECONDS)
    records, text = run_and_check(emulator, w, "vtc", w.weights)
    samples = {
        (s.name, s.labels.get("tenant")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name in ("fairserve_gateway_tenant_weight", "fairserve_gateway_service_total")
    }
    for client, weight in w.weights.items():
        mine = [r for r in records if r.client == client]
        assert samples[("fairserve_gateway_tenant_weight", client)] == weight
        # NOTE: service = w_p·prompt + w_q·output of every finished request, as the backend reported the tokens
        served = sum(r.prompt_tokens + 2 * r.output_tokens for r in mine)
        assert samples[("fairserve_gateway_service_total", client)] == pytest.approx(served), client


def run_and_check(emulator, workload, policy, weights=None):
    records, text = bench_through_gateway(emulator, workload, policy, weights)
    assert len(records) == len(workload.arrivals)
    assert all(r.status == "finished" for r in records), {
        (r.status, r.error) for r in records if r.status != "finished"
    }
    assert all(r.output_tokens == r.max_tokens for r in records)
    return records, text
