"""The paper's synthetic workloads: counts, rates, lengths, on/off, phases, seeding."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fairserve.workloads import WORKLOADS, Arrival, Workload, WorkloadError, make_workload

pytestmark = pytest.mark.unit


def times_of(w: Workload, client: str) -> np.ndarray:
    return np.array([a.arrival_s for a in w.arrivals if a.client == client])


def counts(w: Workload) -> dict[str, int]:
    return dict(Counter(a.client for a in w.arrivals))


def test_names_are_the_papers_then_the_tree_workloads():
    assert WORKLOADS[15:] == (
        "two-orgs",
        "two-orgs-weighted",
        "tiers",
        "tiers-10x",
        "classes-6-3-1",
        "classes-6-3-1-long",
    )
    assert WORKLOADS[:15] == (
        "overload",
        "overload-multi",
        "overload-weighted",
        "proportional",
        "on-off-less",
        "on-off-overload",
        "poisson-on-off-overload",
        "poisson-short-long",
        "poisson-short-long-2",
        "increase",
        "dist-shift",
        "overload-s4-256",
        "overload-s4-512",
        "overload-s4-768",
        "overload-s4-long",
    )


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_builds_sorted_and_in_range(name):
    w = make_workload(name)
    assert w.name == name and w.arrivals
    assert all(isinstance(a, Arrival) for a in w.arrivals)
    t = [a.arrival_s for a in w.arrivals]
    assert t == sorted(t)
    assert 0 <= t[0] and t[-1] < w.duration_s
    assert all(a.prompt_tokens >= 1 and a.output_tokens >= 1 for a in w.arrivals)
    assert all(type(a.prompt_tokens) is int and type(a.arrival_s) is float for a in w.arrivals)
    clients = {a.client for a in w.arrivals}
    assert clients <= {f"client-{i}" for i in range(8)} or all("/" in c for c in clients)


UNIFORM = {  # name: (duration, rates, prompt = output)
    "overload": (360, (1.5, 3), 256),
    "overload-multi": (360, (0.4,) * 3 + (0.6,) * 5, 256),
    "overload-weighted": (360, (0.8, 0.8, 1.2, 1.6), 256),
    "proportional": (600, (0.25, 0.5, 1.5), 256),
    "overload-s4-256": (600, (3, 6), 256),
    "overload-s4-512": (600, (1.5, 3), 512),
    "overload-s4-768": (600, (1, 2), 768),
    "overload-s4-long": (600, (2, 4), 512),
}


@pytest.mark.parametrize("name", UNIFORM)
def test_uniform_counts_spacing_and_lengths(name):
    duration, rates, length = UNIFORM[name]
    w = make_workload(name)
    assert w.duration_s == duration
    assert counts(w) == {f"client-{i}": round(r * duration) for i, r in enumerate(rates)}
    for i, r in enumerate(rates):
        t = times_of(w, f"client-{i}")
        assert 0 <= t[0] < 1 / r  # random phase in [0, 1/rate)
        np.testing.assert_allclose(np.diff(t), 1 / r)
    assert {(a.prompt_tokens, a.output_tokens) for a in w.arrivals} == {(length, length)}


def test_overload_counts_from_the_formula():
    assert counts(make_workload("overload")) == {"client-0": 540, "client-1": 1080}


def test_weights_pool_and_latency_profile():
    assert make_workload("overload-weighted").weights == {"client-0": 1, "client-1": 2, "client-2": 3, "client-3": 4}
    plain = make_workload("overload")
    assert (plain.weights, plain.kv_tokens, plain.latency_profile) == (None, None, None)
    for n in ("overload-s4-256", "overload-s4-512", "overload-s4-768"):
        w = make_workload(n)
        assert (w.kv_tokens, w.latency_profile) == (35_000, "llama-2-13b@a100-80gb")
    w = make_workload("overload-s4-long")
    assert (w.kv_tokens, w.latency_profile) == (65_000, "llama-2-13b@a100-80gb")


def odd_period(t: np.ndarray) -> np.ndarray:
    return np.floor(t / 60) % 2 == 1


@pytest.mark.parametrize("name, rates", [("on-off-less", (0.5, 2)), ("on-off-overload", (2, 3))])
def test_on_off_drops_exactly_the_odd_periods(name, rates):
    w = make_workload(name)
    t0, t1 = times_of(w, "client-0"), times_of(w, "client-1")
    assert not odd_period(t0).any()
    assert len(t0) == rates[0] * 600 / 2  # exactly half the periods survive
    assert {int(x // 60) for x in t0} == {0, 2, 4, 6, 8}
    np.testing.assert_allclose(np.diff(t0[t0 < 60]), 1 / rates[0])
    assert len(t1) == rates[1] * 600 and odd_period(t1).any()  # client 1 is always on


def test_poisson_on_off_overload():
    w = make_workload("poisson-on-off-overload")
    t0 = times_of(w, "client-0")
    assert not odd_period(t0).any()
    assert 0.5 * 300 * 0.7 < len(t0) < 0.5 * 300 * 1.3
    assert 2 * 600 * 0.9 < len(times_of(w, "client-1")) < 2 * 600 * 1.1
    lengths = np.array([(a.prompt_tokens, a.output_tokens) for a in w.arrivals])
    assert lengths.min() >= 16 and lengths.max() < 512
    assert len(np.unique(lengths[:, 0])) > 300 and not (lengths[:, 0] == lengths[:, 1]).all()


@pytest.mark.parametrize(
    "name, lengths",
    [
        ("poisson-short-long", {"client-0": (64, 64), "client-1": (256, 256)}),
        ("poisson-short-long-2", {"client-0": (512, 32), "client-1": (32, 512)}),
    ],
)
def test_poisson_short_long(name, lengths):
    w = make_workload(name)
    total = 9.5 * 600
    assert abs(len(w.arrivals) - total) < 0.05 * total
    assert abs(counts(w)["client-0"] / len(w.arrivals) - 8 / 9.5) < 0.03
    gaps = np.diff([0.0] + [a.arrival_s for a in w.arrivals])
    assert abs(gaps.mean() - 1 / 9.5) < 0.01 and abs(gaps.std() - 1 / 9.5) < 0.01  # exponential
    assert {a.client: (a.prompt_tokens, a.output_tokens) for a in w.arrivals} == lengths


def test_increase_gaps_shrink():
    w = make_workload("increase")
    t0, t1 = times_of(w, "client-0"), times_of(w, "client-1")
    assert len(t0) == 300
    np.testing.assert_allclose(np.diff(t0), 2.0)
    gaps = np.diff(t1)
    assert (np.diff(gaps) < 0).all()
    assert gaps[0] == pytest.approx(5, rel=0.05) and gaps[-1] == pytest.approx(0.5, rel=0.05)
    assert abs(len(t1) - (0.2 + 2) / 2 * 600) < 3  # integral of the rate
    assert len(t1[t1 >= 300]) > 2 * len(t1[t1 < 300])


def test_dist_shift_phases():
    w = make_workload("dist-shift")
    assert w.duration_s == 900
    t0, t1 = times_of(w, "client-0"), times_of(w, "client-1")
    phase = lambda t, k: t[(t >= 300 * k) & (t < 300 * (k + 1))]  # noqa: E731
    assert [len(phase(t0, k)) for k in range(3)] == [90, 300, 150]  # 150 minus 2 off periods of 30
    assert [len(phase(t1, k)) for k in range(3)] == [600, 300, 450]
    assert not odd_period(phase(t0, 0)).any()
    assert odd_period(phase(t0, 1)).any()  # on/off only in the first phase
    np.testing.assert_allclose(np.diff(phase(t1, 2)), 1 / 1.5)


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_identical_different_seed_differs(name):
    assert make_workload(name, seed=3) == make_workload(name, seed=3)
    assert make_workload(name, seed=3).arrivals != make_workload(name, seed=4).arrivals


def test_duration_override_shortens():
    w = make_workload("overload", duration_s=60)
    assert w.duration_s == 60 and counts(w) == {"client-0": 90, "client-1": 180}
    assert max(a.arrival_s for a in w.arrivals) < 60
    # on/off periods and phases keep their absolute times
    t0 = times_of(make_workload("on-off-less", duration_s=150), "client-0")
    assert len(t0) == 30 + 15 and not odd_period(t0).any()
    short = make_workload("dist-shift", duration_s=400)
    assert counts(short) == {"client-0": 90 + 100, "client-1": 600 + 100}
    # the ramp keeps its absolute slope: a shorter "increase" is a prefix of the full one
    full, inc = make_workload("increase"), make_workload("increase", duration_s=300)
    assert inc.arrivals == [a for a in full.arrivals if a.arrival_s < 300]
    assert max(a.arrival_s for a in make_workload("poisson-short-long", duration_s=10).arrivals) < 10


def test_unknown_name_lists_valid_names():
    with pytest.raises(WorkloadError, match="unknown workload 'nope'.*overload-multi.*dist-shift"):
        make_workload("nope")


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), "abc"])
def test_bad_duration(bad):
    with pytest.raises(WorkloadError, match="duration_s"):
        make_workload("overload", duration_s=bad)


def test_real_workload_ships_with_the_package(monkeypatch, tmp_path):
    from fairserve.workloads import find_arena_trace, get_workload
    from fairserve.workloads.real import PACKAGED_ARENA_TRACE

    monkeypatch.delenv("FAIRSERVE_ARENA_TRACE", raising=False)
    monkeypatch.chdir(tmp_path)  # no shared/ anywhere near
    assert find_arena_trace() == PACKAGED_ARENA_TRACE
    w = get_workload("real")
    assert (w.name, w.duration_s, len(w.arrivals)) == ("real", 600.0, 1500)
    assert len({a.client for a in w.arrivals}) == 27
    assert w.arrivals[0] == Arrival(0.0, "client-13", 13, 199)
    assert sum(a.prompt_tokens for a in w.arrivals) / 1500 == pytest.approx(136, abs=1)
    assert sum(a.output_tokens for a in w.arrivals) / 1500 == pytest.approx(256, abs=1)
    assert len(get_workload("real", duration_s=60.0).arrivals) < 1500


def test_real_workload_env_names_another_copy(monkeypatch, tmp_path):
    from fairserve.workloads import find_arena_trace, get_workload

    other = tmp_path / "mine.csv"
    other.write_text("arrival_time_s,client,prompt_tokens,output_tokens\n0.5,x,10,20\n1.0,y,30,40\n")
    monkeypatch.setenv("FAIRSERVE_ARENA_TRACE", str(other))
    assert find_arena_trace() == other
    assert [a.client for a in get_workload("real").arrivals] == ["x", "y"]
    monkeypatch.setenv("FAIRSERVE_ARENA_TRACE", str(tmp_path / "missing.csv"))
    assert find_arena_trace() is None
    with pytest.raises(WorkloadError, match="missing.csv"):
        get_workload("real")


def test_tree_workloads_name_tenants_by_path_with_their_weights_and_priorities():
    w = make_workload("two-orgs-weighted")
    n = counts(w)
    assert sorted(n) == [*(f"org-a/user-{i}" for i in range(10)), "org-b/solo"]
    assert n["org-a/user-0"] == int(0.6 * 360) and n["org-b/solo"] == 3 * 360
    assert w.weights == {"org-a": 3.0, "org-b": 1.0} and w.priorities is None
    tiers = make_workload("tiers-10x")
    assert tiers.priorities == {"premium": 0, "free": 1} and counts(tiers)["free/user-0"] == int(8.5 * 360)
    classes = make_workload("classes-6-3-1")
    assert {a.prompt_tokens for a in classes.arrivals} == {64} and classes.weights["class-c"] == 1.0


def test_the_lower_bound_construction_is_a_named_workload(capsys):
    """`lower-bound` (§4.1.1's construction, docs/preemption.md) is served by name, sized for the default engine: the
    hog's 8 requests fill its pool at time 0 (reserve admission), the late tenant's arrive at 1 s."""
    from fairserve.cli import main
    from fairserve.sim import engine_config
    from fairserve.sim.lower_bound import lower_bound_workload, output_length
    from fairserve.workloads import ALL_WORKLOADS, LOWER_BOUND, get_workload

    assert LOWER_BOUND == "lower-bound" and LOWER_BOUND in ALL_WORKLOADS and LOWER_BOUND not in WORKLOADS
    w = get_workload(LOWER_BOUND)
    assert w == lower_bound_workload(engine_config()) and w.name == LOWER_BOUND and w.kv_tokens == 10_000
    assert counts(w) == {"hog": 48, "late": 48} and {a.arrival_s for a in w.arrivals} == {0.0, 1.0}
    assert {(a.prompt_tokens, a.output_tokens) for a in w.arrivals} == {(8, output_length(engine_config()))}
    assert get_workload(LOWER_BOUND, duration_s=240).duration_s == 240.0
    with pytest.raises(WorkloadError, match="duration_s must be a positive number"):
        get_workload(LOWER_BOUND, duration_s=-1.0)
    assert main(["simulate", "--workload", LOWER_BOUND, "--policy", "vtc,vtc:preempt=500"]) == 0
    out = capsys.readouterr().out
    assert "hog" in out and "late" in out and "preempt at a counter gap > 500" in out
