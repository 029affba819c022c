"""`fairserve reproduce`'s section "Locality-aware fairness (Cao et al. 2025)": its runs (paged, prefix cache, the
pool as the prompts it holds), answers computed from what was measured (and turning when the numbers do), the bound
DLPM is held to, and the section written with its curve."""

from dataclasses import replace

import pytest
from support.golden import quick_run

from fairserve.records import RequestRecord
from fairserve.reproduce import locality, report, runner
from fairserve.reproduce.experiments import OWN_FINDINGS, Results
from fairserve.workloads import prefix_workload

pytestmark = pytest.mark.unit

BY_NAME = {e.name: e for e in OWN_FINDINGS if e.section == locality.SECTION}


def results(exp) -> Results:
    return Results({(r.workload, r.name): quick_run(r) for r in exp.runs})


def swapped(exp, res: Results, policy: str, by: str) -> Results:
    """Every run of `policy` replaced by the run of `by` on the same workload and pool."""
    out = Results(res)
    for r in exp.runs:
        if r.policy == policy:
            other = replace(r, policy=by, label=r.label.replace(policy, by))
            out[r.workload, r.name] = res[other.workload, other.name]
    return out


def test_the_section_runs_every_policy_on_the_paged_engine_with_its_cache():
    assert list(BY_NAME) == ["locality-throughput", "locality-starvation", "locality-no-sharing", "locality-workloads"]
    for e in BY_NAME.values():
        assert e.own and all(r.mode == "paged" and r.prefix_cache for r in e.runs)
        assert {r.policy for r in e.runs} == set(locality.POLICIES)
    curve = BY_NAME["locality-throughput"]
    assert sorted({r.kv_tokens for r in curve.runs}) == [h * locality.PER_CLIENT for h in locality.HELD]
    assert curve.figures == ("locality_curve",) and BY_NAME["locality-starvation"].runs == curve.runs
    # the pool sizes are counted in the named workload's prompts (a change there must show here)
    w = prefix_workload("system-prompts", duration_s=locality.DURATION_S)
    assert {a.prompt_tokens + a.output_tokens for a in w.arrivals} == {locality.PER_CLIENT}
    assert len({a.client for a in w.arrivals}) == locality.CLIENTS


def test_the_answers_come_from_the_numbers():
    exp = BY_NAME["locality-throughput"]
    res = results(exp)
    holds, evidence, ours = exp.judge(res)
    for held in locality.HELD:
        runs = {p: res[locality.CURVE, locality.spec(locality.CURVE, p, held).name] for p in locality.POLICIES}
        ratio = runs[locality.DLPM].summary.service_per_s / runs[locality.VTC].summary.service_per_s
        assert f"({ratio:.2f}×, hit" in evidence
        assert runs[locality.DLPM].summary.max_backlogged_diff <= locality.dlpm_bound(runs[locality.DLPM])
    assert exp.judge(swapped(exp, res, locality.DLPM, locality.VTC))[0] is False  # DLPM as VTC: 1.00×
    starve = BY_NAME["locality-starvation"]
    assert starve.judge(swapped(starve, res, locality.LPM, locality.DLPM))[0] is False  # LPM as DLPM: 1.0×
    assert "LPM" in starve.judge(res)[1] and "the ratio tends to about" in starve.judge(res)[1]
    # a client LPM never admits waits the whole run, DLPM's worst about the share it leaves waiting
    assert locality.overload_ceiling(12, 30) == "the ratio tends to about 2.5× under overload"
    assert locality.overload_ceiling(0, 30) == "DLPM keeps up"


def test_the_bound_counts_the_most_output_running_together():
    def rec(i, admit, finish, out):
        return RequestRecord(i, "a", 0.0, admit, admit, finish, finish, 10, out, out, "finished")

    o = quick_run(locality.spec(locality.NO_SHARING, locality.VTC, locality.OTHERS_HELD))
    o = replace(o, records=[rec(0, 0.0, 5.0, 30), rec(1, 1.0, 2.0, 50), rec(2, 2.0, 3.0, 40), rec(3, 6.0, 7.0, 100)])
    assert locality.most_running_output(o) == 100  # 30 + 50 at 1 s, 30 + 40 at 2 s (1 ended), 100 alone at 6 s
    assert locality.dlpm_bound(o) == 2 * (locality.QUANTUM + o.max_prompt + 2 * 100)
    assert locality.worst_median_ttft(o) == 1.5  # waits 0, 1, 2 and 6 s: one client, its median
    assert locality.dlpm_bound(replace(o, spec=replace(o.spec, w_cached=0.25))) == locality.dlpm_bound(o)
    dear = replace(o, spec=replace(o.spec, w_cached=3.0))  # a cached prompt token above w_p: the prompt's term grows
    assert locality.dlpm_bound(dear) == 2 * (locality.QUANTUM + 3 * o.max_prompt + 2 * 100)


def test_a_price_for_cached_tokens_reaches_every_run_and_its_measure(monkeypatch):
    from fairserve.reproduce.runs import run

    monkeypatch.setattr(locality, "W_CACHED", 0.25)
    spec = replace(locality.spec(locality.CURVE, locality.VTC, 8), workload="system-prompts@4s")
    assert spec.w_cached == 0.25 and "a cached prompt token 0.25" in locality._scope("x")
    o = run(spec)
    assert o.cost.name == "linear(1,2,cached=0.25)" and any(r.cached_tokens for r in o.records)
    served = [r for r in o.records if r.first_token_s is not None]
    expect = sum(r.prompt_tokens - 0.75 * r.cached_tokens + 2 * r.output_tokens for r in served)
    assert sum(c.service for c in o.summary.clients.values()) == expect


def test_reproduce_writes_the_section_with_its_curve(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run", lambda spec, quick, trace: quick_run(spec))  # NOTE: the runs simulated above
    findings = runner.reproduce(
        tmp_path, only=["locality-throughput", "locality-no-sharing"], quick=True, jobs=1, progress=False
    )
    curve, plain = findings
    assert curve.verdict in ("yes", "no") and plain.verdict in ("yes", "no") and not plain.figures
    ((png, caption),) = curve.figures
    assert png == "locality-throughput-locality_curve.png" and (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "report.md").read_text()
    assert f"**{locality.SECTION}** — our own findings" in md and caption in md
    assert f"{locality.SECTION} (our own findings" in report.readme_table(findings)
