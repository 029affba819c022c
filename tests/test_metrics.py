"""Metrics by hand on tiny record sets."""

import numpy as np
import pytest

from fairserve.metrics import (
    backlogged,
    backlogged_difference,
    client_stats,
    jain,
    service_curves,
    service_rates,
    summarize,
    time_grid,
    windowed_jain,
)
from fairserve.records import RequestRecord

pytestmark = pytest.mark.unit


def rec(client, arrival, admit, first, last, prompt=10, out=5, status="finished"):
    return RequestRecord(
        id=None,
        client=client,
        arrival_s=arrival,
        admit_s=admit,
        first_token_s=first,
        finish_s=last if status == "finished" else None,
        last_token_s=last,
        prompt_tokens=prompt,
        output_tokens=out,
        max_tokens=out,
        status=status,
    )


def test_service_curve_prompt_at_first_token_output_spread_to_last():
    r = rec("a", 0, 1, 2, 6, prompt=10, out=5)  # 10 + 2 at t=2, then 8 more spread over [2, 6]
    times = np.array([0.0, 1.9, 2.0, 4.0, 6.0, 9.0])
    np.testing.assert_allclose(service_curves([r], times)["a"], [0, 0, 12, 16, 20, 20])
    np.testing.assert_allclose(service_curves([r], times, w_p=0, w_q=1)["a"], [0, 0, 1, 3, 5, 5])


def test_service_rates_centered_window():
    r = rec("a", 0, 0, 0, 10, prompt=0, out=11)  # 2 at t=0, then 20 over 10 s
    times = time_grid(10)
    rates = service_rates(service_curves([r], times), times, window_s=4)["a"]
    assert rates[5] == pytest.approx(2.0)


def test_backlogged_between_arrival_and_admission():
    rs = [
        rec("a", 1, 3, 4, 5),
        rec("a", 2, 6, 7, 8),
        rec("b", 0, None, None, None, status="unfinished"),
        rec("c", 0, None, None, None, status="rejected"),
    ]
    busy = backlogged(rs, time_grid(8))
    assert busy["a"].tolist() == [False, True, True, True, True, True, False, False, False]
    assert busy["b"].all() and not busy["c"].any()


def test_backlogged_difference_counts_only_joint_stretches():
    curves = {"a": np.array([0, 10, 20, 30, 40, 50.0]), "b": np.array([0, 0, 0, 0, 100, 100.0])}
    busy = {"a": np.array([1, 1, 1, 0, 1, 1], bool), "b": np.ones(6, bool)}
    series, worst, pair = backlogged_difference(curves, busy)
    # stretch [0, 2]: d = 0, 10, 20 -> 20; stretch [4, 5]: d = -60, -50 -> 10
    assert worst == 20 and pair == ("a", "b")
    np.testing.assert_allclose(series, [0, 10, 20, 0, 0, 10])
    _, w2, _ = backlogged_difference(curves, busy, weights={"a": 2})
    assert w2 == 10


def test_jain():
    assert jain([1, 1, 1]) == 1.0
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)
    times = time_grid(4)
    curves = {"a": np.arange(5.0), "b": np.arange(5.0) * 3}
    busy = {"a": np.ones(5, bool), "b": np.ones(5, bool)}
    j = windowed_jain(curves, busy, times, window_s=2)
    np.testing.assert_allclose(j, [16 / 20, 16 / 20])
    np.testing.assert_allclose(windowed_jain(curves, busy, times, window_s=2, weights={"b": 3}), [1, 1])


def test_client_stats_and_summary():
    rs = [
        rec("a", 0, 0, 1, 2),
        rec("a", 0, 0, 3, 4),
        rec("b", 0, None, None, None, out=0, status="rejected"),
        rec("b", 1, 1, 2, 9, out=2, status="unfinished"),
    ]
    st = client_stats(rs, 10)
    assert st["a"].response_mean_s == 2 and st["a"].response_p90_s == pytest.approx(2.8)
    assert st["a"].service == 2 * (10 + 10) and st["a"].finished == 2
    assert (st["b"].rejected, st["b"].unfinished, st["b"].output_tokens) == (1, 1, 2)
    s = summarize(rs, 10)
    assert s.output_tokens_per_s == pytest.approx(1.2)
    assert s.to_dict()["clients"]["a"]["requests"] == 2
