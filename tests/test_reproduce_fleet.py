"""`fairserve reproduce`'s section "The paper's future work (§C.3): a fleet and auto-scaling": runs carry the fleet's
options into the simulation (and every other run keeps its name and options), the fleet's bound counts the engines'
pools together, the `flood` workload has its shape, and each answer is computed from what was measured and turns
when the numbers do (FCFS's runs in VTC's place, least-loaded's in shard:2's, the fixed fleet in the autoscaled's)."""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from support.golden import quick_run

from fairserve.core import theorem_bound
from fairserve.reproduce import fleet, report, runner
from fairserve.reproduce.experiments import ALL_EXPERIMENTS, OWN_FINDINGS, Results
from fairserve.reproduce.runs import RunSpec, run
from fairserve.sim import SimOptions
from fairserve.workloads import ALL_WORKLOADS, get_workload
from fairserve.workloads.flood import BURST, FLOOD, LIGHT

pytestmark = pytest.mark.unit

BY_NAME = {e.name: e for e in OWN_FINDINGS if e.section == fleet.SECTION}


def results(exp) -> Results:
    return Results({(r.workload, r.name): quick_run(r) for r in exp.runs})


def swapped(exp, res: Results, pick, to) -> Results:
    """Every run `pick(spec)` selects replaced by the run `to(spec)` names: what the section would see if the two
    did the same."""
    out = Results(res)
    for r in exp.runs:
        if pick(r):
            other = to(r)
            out[r.workload, r.name] = res[other.workload, other.name]
    return out


def test_the_section_has_three_findings_with_their_figures():
    assert list(BY_NAME) == ["fleet-bound", "fleet-autoscale", "fleet-shard"]
    assert [e.figures for e in BY_NAME.values()] == [("fleet_bound",), ("fleet_scaling",), ()]
    for e in BY_NAME.values():
        assert e.own and e.source.startswith("beyond §C.3") and all(r.options().fleet for r in e.runs)
    assert {r.engines for r in BY_NAME["fleet-bound"].runs} == set(fleet.SIZES)
    assert {r.kv_tokens for r in BY_NAME["fleet-bound"].runs} == {fleet.POOL}


def test_a_run_names_its_fleet_and_passes_it_to_the_simulation():
    spec = RunSpec("real", "rpm:30", autoscale="1:4", scale_wait_s=5.0, scale_delay_s=30.0)
    assert spec.name == "rpm:30 (autoscale 1:4, wait 5 s, start-up 30 s)"
    assert spec.options() == replace(
        SimOptions(policy="rpm:30", cost="linear"), autoscale="1:4", scale_wait_s=5.0, scale_delay_s=30.0
    )
    shard = RunSpec(FLOOD, "vtc", engines=8, dispatch="shard:2", without=FLOOD)
    assert shard.name == "vtc (8 engines, shard:2, without flood)"
    assert (shard.options().engines, shard.options().dispatch) == (8, "shard:2")
    # every run without a fleet keeps its name and its options: one engine, no dispatcher
    others = [r for e in ALL_EXPERIMENTS if e.section != fleet.SECTION for r in e.runs]
    assert others and not any(r.options().fleet for r in others)
    assert RunSpec("overload", "vtc", mode="paged").name == "vtc (paged)"
    assert RunSpec("overload", "vtc").options() == SimOptions(policy="vtc", cost="linear")


def test_a_fleet_run_keeps_its_cost_and_engines_and_leaves_out_a_tenant():
    o = quick_run(fleet.scaled_spec("vtc"))
    assert o.counts[0] == (0.0, fleet.LOW) and 1 < o.engines <= fleet.HIGH  # it scaled out, within 1:4
    assert 0 < o.engine_seconds < fleet.HIGH * o.duration_s
    assert quick_run(RunSpec("overload", "vtc")).engine_seconds is None  # one engine: no fleet
    calm = run(replace(fleet.shard_spec("vtc", "least_loaded", flood=False), workload=f"{FLOOD}@5s"))
    assert {r.client for r in calm.records} == set(LIGHT) and calm.lost == 0


def test_the_flood_workload():
    w = get_workload(FLOOD)
    sent = Counter(a.client for a in w.arrivals)
    assert FLOOD in ALL_WORKLOADS and w.duration_s == 30 and sent[FLOOD] == BURST
    assert all(sent[c] == 30 for c in LIGHT) and len(sent) == len(LIGHT) + 1
    burst = [a.arrival_s for a in w.arrivals if a.client == FLOOD]
    assert 1.0 <= min(burst) and max(burst) < 1.5  # at once
    assert [a.arrival_s for a in w.arrivals] == sorted(a.arrival_s for a in w.arrivals)
    assert get_workload(FLOOD, seed=1) != w and len(get_workload(FLOOD, duration_s=10).arrivals) == 7 * 10 + BURST


def test_the_bound_counts_every_engines_pool_and_vtc_keeps_within_it():
    exp = BY_NAME["fleet-bound"]
    res = results(exp)
    for n in fleet.SIZES:
        vtc, fcfs = (res["overload", fleet.bound_spec(p, n).name] for p in ("vtc", "fcfs"))
        assert vtc.engines == n and vtc.bound == theorem_bound(256, n * fleet.POOL)
        assert vtc.summary.max_backlogged_diff <= vtc.bound < fcfs.summary.max_backlogged_diff  # FCFS: the control
    holds, evidence, ours = exp.judge(res)
    assert holds and "8 engines: 2U 64,000;" in evidence and "FCFS above it at N = 1, 2, 4, 8" in ours
    as_fcfs = swapped(exp, res, lambda r: r.policy == "vtc", lambda r: replace(r, policy="fcfs"))
    assert exp.judge(as_fcfs)[0] is False


def test_rpm_rejects_as_many_autoscaled_and_vtc_serves_all_for_less():
    exp = BY_NAME["fleet-autoscale"]
    res = results(exp)
    rpm_fixed, rpm_scaled = (res["real", s("rpm:30").name] for s in (fleet.fixed_spec, fleet.scaled_spec))
    assert rpm_fixed.lost == rpm_scaled.lost > 0  # the limit is per tenant, blind to the fleet
    vtc_fixed, vtc_scaled = (res["real", s("vtc").name] for s in (fleet.fixed_spec, fleet.scaled_spec))
    assert vtc_scaled.lost == 0 and vtc_scaled.engine_seconds < vtc_fixed.engine_seconds
    holds, evidence, ours = exp.judge(res)
    saved = 1 - vtc_scaled.engine_seconds / vtc_fixed.engine_seconds
    assert holds and f"VTC rejects 0 with {saved:.0%} fewer engine-seconds" in ours
    assert f"rpm:30 rejects {rpm_scaled.lost} autoscaled vs {rpm_fixed.lost}" in ours and "p50 / p95" in evidence
    # the fixed fleet in the autoscaled runs' place: no cheaper, so no
    fixed = swapped(exp, res, lambda r: r.autoscale is not None, lambda r: fleet.fixed_spec(r.policy))
    assert exp.judge(fixed)[0] is False


def test_shard_2_keeps_the_light_tenants_as_calm_as_without_the_flood():
    exp = BY_NAME["fleet-shard"]
    res = results(exp)
    for policy in fleet.SHARD_POLICIES:
        calm, storm = (fleet.light_median(res[FLOOD, fleet.shard_spec(policy, "shard:2", f).name]) for f in (0, 1))
        ll = [fleet.light_median(res[FLOOD, fleet.shard_spec(policy, "least_loaded", f).name]) for f in (0, 1)]
        assert storm <= fleet.TTFT_GOAL * calm and ll[1] > 2 * ll[0]  # least-loaded lets the flood reach everyone
    holds, evidence, ours = exp.judge(res)
    assert holds and "(vtc, shard:2)" in ours and "fcfs, least_loaded:" in evidence
    as_least = swapped(exp, res, lambda r: r.dispatch == "shard:2", lambda r: replace(r, dispatch="least_loaded"))
    assert exp.judge(as_least)[0] is False


def test_ttft_counts_a_request_never_started_to_the_end_and_leaves_out_the_rejected():
    o = quick_run(fleet.fixed_spec("rpm:30"))
    assert len(fleet.ttft(o)) == len(o.records) - o.lost
    never = replace(o.records[0], first_token_s=None, admit_s=None, status="unfinished")
    short = replace(o, records=[never], _cache={})
    assert np.allclose(fleet.ttft(short), [o.duration_s - never.arrival_s])


def test_reproduce_writes_the_section_with_its_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run", lambda spec, quick, trace: quick_run(spec))  # NOTE: the runs simulated above
    found = runner.reproduce(tmp_path, only=list(BY_NAME), quick=True, jobs=1, progress=False)
    assert [f.verdict for f in found] == ["yes", "yes", "yes"]
    pngs = [png for f in found for png, _ in f.figures]
    assert pngs == ["fleet-bound-fleet_bound.png", "fleet-autoscale-fleet_scaling.png"]
    assert all((tmp_path / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)
    md = (tmp_path / "report.md").read_text()
    assert f"**{fleet.SECTION}** — our own findings" in md and "| flood | vtc (8 engines, shard:2) |" in md
    assert f"{fleet.SECTION} (our own findings" in report.readme_table(found)
