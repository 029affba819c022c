"""`fairserve reproduce`'s section "The paper's future work (§C.3): preemption": runs carry an engine mode and engine
options, the answers are computed from what was measured (and turn when the numbers do), and the section is written
with its figures and overview rows."""

from dataclasses import replace

import pytest
from support.golden import quick_run

from fairserve.reproduce import preemption, report, runner
from fairserve.reproduce.experiments import OWN_FINDINGS, Results
from fairserve.reproduce.runs import RunSpec
from fairserve.sim import engine_config
from fairserve.sim.lower_bound import held_back

pytestmark = pytest.mark.unit

BY_NAME = {e.name: e for e in OWN_FINDINGS if e.section == preemption.SECTION}
GOALS = {"preempt-overload": ("overload", "reserve"), "preempt-overload-multi": ("overload-multi", "paged")}


def results(exp) -> Results:
    return Results({(r.workload, r.name): quick_run(r) for r in exp.runs})


def without_preemption(exp, res: Results) -> Results:
    """Every `preempt=DELTA` run replaced by plain VTC's run in the same mode: what the section would see if the
    option did nothing."""
    out = Results(res)
    for r in exp.runs:
        if "preempt=" in r.policy:
            out[r.workload, r.name] = res[r.workload, RunSpec(r.workload, "vtc", mode=r.mode).name]
    return out


def test_the_section_has_three_findings_over_both_modes():
    assert list(BY_NAME) == ["preempt-overload", "preempt-overload-multi", "preempt-lower-bound"]
    for e in BY_NAME.values():
        assert e.own and e.source.startswith("beyond §C.3") and e.figures == ("preemption_curve",)
        assert {r.mode for r in e.runs} == {"reserve", "paged"} and len(e.workloads) == 1
        assert {r.policy for r in e.runs} == set(preemption.POLICIES)


@pytest.mark.parametrize("name", list(GOALS))
def test_the_goal_is_judged_on_its_mode_from_the_numbers(name):
    exp, (workload, mode) = BY_NAME[name], GOALS[name]
    res = results(exp)
    plain = res[workload, RunSpec(workload, "vtc", mode=mode).name]
    reached = []
    for d in preemption.DELTAS:
        o = res[workload, RunSpec(workload, f"vtc:preempt={d}", mode=mode).name]
        assert o.spec.mode == mode and o.fair_preemptions > 0 and o.lost == 0
        s, p = o.summary, plain.summary
        if s.max_backlogged_diff <= 0.5 * p.max_backlogged_diff and s.service_per_s >= 0.97 * p.service_per_s:
            reached.append(f"DELTA {d:,}")
    holds, evidence, ours = exp.judge(res)
    assert holds is bool(reached) and f"reached by {', '.join(reached) or 'no DELTA'}" in evidence
    assert f"{workload}, {mode} mode: plain VTC {plain.summary.max_backlogged_diff:,.0f};" in evidence
    assert exp.judge(without_preemption(exp, res))[0] is False


def test_the_construction_holds_back_plain_vtc_and_preemption_goes_below_the_lower_bound():
    exp = BY_NAME["preempt-lower-bound"]
    res = results(exp)
    lower = held_back(engine_config())
    reserve, paged = (res["lower-bound", RunSpec("lower-bound", "vtc", mode=m).name] for m in ("reserve", "paged"))
    assert reserve.summary.max_backlogged_diff > lower  # reserve admission: the hog's batch holds the pool
    assert paged.summary.max_backlogged_diff == 0  # paged: every short prompt is admitted at arrival
    holds, evidence, ours = exp.judge(res)
    below = [
        d
        for d in preemption.DELTAS
        if res["lower-bound", f"vtc:preempt={d}"].summary.max_backlogged_diff < lower
        and res["lower-bound", f"vtc:preempt={d}"].summary.service_per_s >= 0.97 * reserve.summary.service_per_s
    ]
    assert holds is bool(below) and f"lower bound {lower:,.0f}" in ours and "holds nobody back" in evidence
    assert exp.judge(without_preemption(exp, res))[0] is False


def test_a_run_names_its_mode_and_keeps_its_options():
    spec = RunSpec("overload", "vtc:preempt=500", mode="paged")
    assert spec.name == "vtc:preempt=500 (paged)" and replace(spec, mode="reserve").name == "vtc:preempt=500"
    paged, reserve = quick_run(spec), quick_run(replace(spec, mode="reserve"))
    assert paged.records != reserve.records and paged.preemptions > paged.fair_preemptions > 0


def test_reproduce_writes_the_section_with_its_curve(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run", lambda spec, quick, trace: quick_run(spec))  # NOTE: the runs simulated above
    findings = runner.reproduce(tmp_path, only=["preempt-lower-bound"], quick=True, jobs=1, progress=False)
    (f,) = findings
    assert f.holds is not None and f.verdict in ("yes", "no")
    ((png, caption),) = f.figures
    assert png == "preempt-lower-bound-preemption_curve.png" and (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "report.md").read_text()
    overview = md.split("## Overview")[1].split("<a id=")[0]
    assert f"**{preemption.SECTION}** — our own findings" in overview and "[preempt-lower-bound]" in overview
    assert "| lower-bound | vtc:preempt=500 (paged) |" in md and caption in md
    table = report.readme_table(findings)
    assert f"{preemption.SECTION} (our own findings" in table and f"`{png}`" in table
