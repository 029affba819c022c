"""The run-based metrics compute all clients at once (composite keys client * (n_t + 1) + grid point, running sums
client by client): here, on 200 clients, each client's share of that against the client computed alone and against
the definitions. The oracle tests of test_backlogged_difference.py read the same batched curves on both sides, so a
mix-up between clients (a key or a running sum read off by one client) would pass there and fails here."""

import numpy as np
import pytest

from fairserve.core.cost import CostFunction, LinearCost, make_cost
from fairserve.metrics import (
    backlog_runs,
    backlogged_difference,
    backlogged_jain,
    client_stats,
    largest_backlogged_difference,
    prepare_curves,
    time_grid,
    windowed_jain,
)
from fairserve.records import RequestRecord

pytestmark = pytest.mark.unit

CLIENTS, HORIZON = 200, 120.0


def many_clients(seed: int, requests: int = 1500) -> tuple[list[RequestRecord], dict[str, float]]:
    """Requests of 200 clients on and between grid points, as test_backlogged_difference's generator draws them;
    some with cached prompt tokens, some clients weighted."""
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(requests):
        client = f"c{int(rng.integers(CLIENTS)):03d}"
        arrival = float(rng.integers(0, 2 * HORIZON)) / 2
        status = str(rng.choice(["finished", "finished", "unfinished", "rejected"]))
        admit = first = last = None
        if status != "rejected" and rng.random() < 0.7:
            admit = arrival + float(rng.choice([0.0, 0.5, 1.0, 3.0, 12.0, 30.0]))
            if rng.random() < 0.8:
                first = admit + float(rng.choice([0.0, 0.5, 1.0, 2.0]))
                last = first + float(rng.choice([0.0, 0.25, 1.0, 4.0, 9.5]))
        if status == "finished" and first is None:
            status = "unfinished"
        out = int(rng.integers(0 if first is None else 1, 41))
        prompt = int(rng.integers(1, 61))
        records.append(
            RequestRecord(
                None, client, arrival, admit, first, last if status == "finished" else None, last, prompt, out,
                max(out, 1), status, int(rng.integers(0, prompt + 1)) if rng.random() < 0.3 else 0,
            )
        )  # fmt: skip
    weights = {f"c{i:03d}": float(rng.choice([0.5, 2.0, 3.0])) for i in rng.choice(CLIENTS, 60, replace=False)}
    return records, weights


def alone(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        out.setdefault(r.client, []).append(r)
    return out


def by_definition(records: list[RequestRecord], times: np.ndarray, h: LinearCost) -> np.ndarray:
    """A client's service under the linear cost, request by request: the prompt and first token at the first token,
    the other output tokens spread evenly to the latest token."""
    total = np.zeros(len(times))
    for r in records:
        if r.first_token_s is None or r.output_tokens == 0:
            continue
        f = r.first_token_s
        last = f if r.last_token_s is None else r.last_token_s
        share = np.clip((times - f) / (last - f), 0.0, 1.0) if last > f else (times >= f).astype(float)
        step = h.total(r.prompt_tokens, 1) + h.cached(r.prompt_tokens, r.cached_tokens)
        total += np.where(times >= f, step + h.w_q * (r.output_tokens - 1) * share, 0.0)
    return total


def dense_busy(rs: list[RequestRecord], times: np.ndarray) -> np.ndarray:
    """The definition: arrived at or before t, admitted after t, not rejected."""
    waiting = [r for r in rs if r.status != "rejected"]
    arrived = np.sort([r.arrival_s for r in waiting])
    admitted = np.sort([r.admit_s for r in waiting if r.admit_s is not None])
    return (np.searchsorted(arrived, times, "right") - np.searchsorted(admitted, times, "right")) > 0


@pytest.mark.parametrize(
    ("seed", "cost"), [(0, LinearCost()), (1, LinearCost(1.0, 2.0, w_cached=0.25)), (2, make_cost("profiled"))]
)
def test_each_clients_curve_is_the_one_it_has_alone_whichever_points_are_read_with_it(seed: int, cost: CostFunction):
    records, _ = many_clients(seed)
    times = time_grid(HORIZON + 45, 0.5)
    every = np.arange(len(times))
    curves = prepare_curves(records, times, cost=cost)
    assert len(curves) == len(alone(records)) > 150
    own = {c: prepare_curves(rs, times, cost=cost)[c].at(every) for c, rs in alone(records).items()}
    for c, rs in alone(records).items():
        assert np.array_equal(curves[c].at(every), own[c]), c  # bit for bit
        if isinstance(cost, LinearCost):
            np.testing.assert_allclose(own[c], by_definition(rs, times, cost), rtol=1e-12, atol=1e-9)
    # many clients' points in one read, shuffled: each the same float as read alone
    rng = np.random.default_rng(seed)
    who, at = rng.integers(len(curves), size=5000), rng.integers(len(times), size=5000)
    got = curves.at(who, at)
    assert np.array_equal(got, [own[curves.names[c]][i] for c, i in zip(who.tolist(), at.tolist(), strict=True)])


@pytest.mark.parametrize("seed", [3, 4])
def test_runs_difference_and_jain_on_many_clients_equal_each_client_computed_alone(seed: int):
    records, weights = many_clients(seed)
    times = time_grid(HORIZON + 45)
    every = np.arange(len(times))
    runs = backlog_runs(records, times)
    curves, busy = {}, {}
    for c, rs in alone(records).items():
        assert np.array_equal(runs[c], backlog_runs(rs, times)[c]), c
        curves[c], busy[c] = prepare_curves(rs, times)[c].at(every), dense_busy(rs, times)
        on = np.zeros(len(times) + 1, dtype=int)
        np.add.at(on, runs[c][:, 0], 1)
        np.add.at(on, runs[c][:, 1] + 1, -1)
        assert np.array_equal(np.cumsum(on[:-1]) > 0, busy[c]), c
    _, want, want_pair = backlogged_difference(curves, busy, weights)
    got = largest_backlogged_difference(prepare_curves(records, times), runs, weights)
    assert got.exact and (got.value, got.pair) == (want, want_pair) and want > 0
    clean = {c: np.round(v, 6) for c, v in curves.items()}  # NOTE: as test_backlogged_difference: ramp noise dropped
    for window in (4.0, 10.0):
        want_jain = windowed_jain(clean, busy, times, window, weights)
        got_jain = backlogged_jain(prepare_curves(records, times), runs, times, window, weights)
        assert np.isfinite(got_jain).sum() > 5
        np.testing.assert_allclose(got_jain, want_jain, rtol=1e-6, atol=0)


@pytest.mark.parametrize(("seed", "cost"), [(5, LinearCost(1.0, 2.0, w_cached=0.25)), (6, make_cost("profiled"))])
def test_client_stats_on_many_clients_equal_each_client_computed_alone(seed: int, cost: CostFunction):
    records, _ = many_clients(seed)
    stats = client_stats(records, 100.0, cost=cost)
    assert list(stats) == sorted(alone(records))
    for c, rs in alone(records).items():
        assert stats[c] == client_stats(rs, 100.0, cost=cost)[c]
        served = [r for r in rs if r.first_token_s is not None]
        response = [r.first_token_s - r.arrival_s for r in served]
        assert (stats[c].requests, stats[c].rejected) == (len(rs), sum(r.status == "rejected" for r in rs))
        assert stats[c].prompt_tokens == sum(r.prompt_tokens for r in served)
        assert stats[c].service == sum(
            cost.total(r.prompt_tokens, r.output_tokens) + cost.cached(r.prompt_tokens, r.cached_tokens) for r in served
        )  # in record order, as the loop adds them
        if served:
            assert stats[c].response_mean_s == pytest.approx(np.mean(response), rel=1e-14)
            assert (stats[c].response_p50_s, stats[c].response_p90_s) == tuple(np.percentile(response, [50, 90]))
        else:
            assert stats[c].response_mean_s is stats[c].response_p50_s is None
