"""`fairserve reproduce`: every file is written, verdicts come from the data, and missing data is said so."""

import pytest

from fairserve.cli import main
from fairserve.reproduce import report, runner
from fairserve.reproduce.experiments import EXPERIMENTS, Results
from fairserve.reproduce.runs import RunSpec, run

pytestmark = pytest.mark.unit

BY_NAME = {e.name: e for e in EXPERIMENTS}


def quick(workload, policy, **kw):
    return run(RunSpec(workload, policy, **kw), quick=True)


@pytest.mark.parametrize(
    "name, workload, fair, unfair",
    [
        ("overload", "overload", "vtc", "fcfs"),
        ("on-off-overload", "on-off-overload", "vtc", "fcfs"),
        ("poisson-short-long", "poisson-short-long", "vtc", "fcfs"),
        ("proportional", "proportional", "vtc", "fcfs"),
        ("dist-shift", "dist-shift", "vtc", "lcf"),
        ("real", "real", "vtc", "fcfs"),
    ],
)
def test_a_deliberately_unfair_result_does_not_hold(name, workload, fair, unfair):
    a, b = quick(workload, fair), quick(workload, unfair)
    honest = Results({(workload, fair): a, (workload, unfair): b})
    swapped = Results({(workload, fair): b, (workload, unfair): a})  # the baseline's outcome labelled as VTC
    assert report.judge(BY_NAME[name], honest)[0] is True
    assert report.judge(BY_NAME[name], swapped)[0] is False


def test_weighted_verdict_checks_both_splits():
    wl = "overload-weighted@600s"
    w, plain = quick(wl, "vtc"), quick(wl, "vtc", weighted=False)
    exp = BY_NAME["weighted"]
    assert report.judge(exp, Results({(wl, "weighted vtc"): w, (wl, "vtc (no weights)"): plain}))[0] is True
    assert report.judge(exp, Results({(wl, "weighted vtc"): plain, (wl, "vtc (no weights)"): w}))[0] is False


def test_profiled_cost_verdict_tells_vtc_from_lcf():
    exp = BY_NAME["profiled-cost"]
    v, lcf, f = (quick("real", p, cost="profiled") for p in ("vtc", "lcf", "fcfs"))
    names = ("vtc (profiled cost)", "lcf (profiled cost)", "fcfs (profiled cost)")
    assert report.judge(exp, Results({("real", n): o for n, o in zip(names, (v, lcf, f), strict=False)}))[0] is True
    assert report.judge(exp, Results({("real", n): o for n, o in zip(names, (lcf, v, f), strict=False)}))[0] is False
    assert report.judge(exp, Results({("real", n): o for n, o in zip(names, (f, lcf, v), strict=False)}))[0] is False


def test_a_duration_suffix_runs_the_named_workload_longer():
    short, long_ = quick("overload", "vtc"), run(RunSpec("overload@600s", "vtc"))
    assert (short.duration_s, long_.duration_s) == (240.0, 600.0)
    assert max(r.arrival_s for r in long_.records) > 500


def test_missing_runs_are_not_evaluated_rather_than_crashing():
    holds, evidence, ours = report.judge(BY_NAME["overload"], Results())
    assert holds is None and "could not be evaluated" in evidence and ours == ""


def test_reproduce_writes_every_file(tmp_path):
    findings = runner.reproduce(tmp_path, only=["overload", "weighted"], quick=True, progress=False)
    assert [f.experiment.name for f in findings] == ["overload", "weighted"]
    assert all(f.holds for f in findings)
    md, page = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    for f in findings:
        assert f.figures
        for name, caption in f.figures:
            png = tmp_path / name
            assert png.read_bytes()[:4] == b"\x89PNG"
            assert f"]({name})" in md and caption in md
        assert f"## {f.experiment.name}:" in md and f.experiment.claim in md
    assert md.count("**Verdict: holds.**") == 2
    overview = md.split("## Overview")[1].split("<a id=")[0]
    for f in findings:  # the overview: claim, scope, the paper's figure, ours, verdict, a link to the figure
        assert f"[{f.experiment.name}](#{f.experiment.name})" in overview and f.experiment.source in overview
        assert f.ours and f.ours in overview and f"]({f.figures[0][0]})" in overview
        assert f'<a id="{f.experiment.name}"></a>' in md and f.experiment.scope in md
    assert "1,340 / 1,305 per s, VTC / FCFS (re-run artifact" in overview  # the paper's own figure beside ours
    assert page.count("data:image/png;base64,") == sum(len(f.figures) for f in findings)
    assert "<table>" in page and "Verdict: holds." in page


def test_report_says_does_not_hold(tmp_path):
    exp = BY_NAME["overload"]
    a, b = quick("overload", "vtc"), quick("overload", "fcfs")
    holds, evidence, ours = report.judge(exp, Results({("overload", "vtc"): b, ("overload", "fcfs"): a}))
    report.write(
        [report.Finding(exp, holds, evidence, [], [b, a], ours)],
        tmp_path,
        {"engine": "test", "mode": "quick", "runs": 2, "wall_s": 0.0},
    )
    md = (tmp_path / "report.md").read_text()
    assert "**Verdict: does not hold.**" in md and "| overload |" in md
    assert "does not hold" in (tmp_path / "report.html").read_text()


def test_real_experiments_are_skipped_without_the_trace(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "trace_available", lambda trace: False)
    findings = runner.reproduce(tmp_path, only=["real", "weighted"], quick=True, progress=False)
    real, weighted = findings
    assert real.holds is None and "trace was not found" in real.evidence and not real.figures
    assert weighted.holds is True
    assert "trace was not found" in (tmp_path / "report.md").read_text()


def test_cli_reproduce(tmp_path, capsys):
    assert (
        main(["reproduce", "--out", str(tmp_path), "--only", "weighted", "--quick", "--jobs", "1", "--no-progress"])
        == 0
    )
    out = capsys.readouterr().out
    assert "weighted" in out and "holds" in out and "report.html" in out
    assert (tmp_path / "report.html").exists()
    assert main(["reproduce", "--only", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown experiment" in capsys.readouterr().err
    assert main(["reproduce", "--trace", "/no/such.csv", "--out", str(tmp_path)]) == 2


def test_own_findings_are_reported_apart_and_the_readme_table_comes_from_the_report(tmp_path):
    findings = runner.reproduce(tmp_path, only=["overload", "profiled-synthetic"], quick=True, progress=False)
    paper, own = findings
    assert not paper.experiment.own and own.experiment.own and own.verdict in ("yes", "no")
    md = (tmp_path / "report.md").read_text()
    overview = md.split("## Overview")[1].split("<a id=")[0]
    assert "Beyond the paper's scope" in overview
    assert overview.index("[overload](#overload)") < overview.index("Beyond") < overview.index("[profiled-synthetic]")
    assert f"**Answer: {own.verdict}.**" in md and "**Our question:**" in md
    table = report.readme_table(findings)
    assert "| overload | §5.2, Fig. 3, p. 10 |" in table and f"`{paper.figures[0][0]}`" in table
    assert "| profiled-synthetic | beyond §B.2" in table and f"**{own.verdict}**" in table
    assert table.index("| overload |") < table.index("Beyond the paper's scope") < table.index("| profiled-synthetic |")


def test_experiments_without_simulations_are_judged(tmp_path):
    (f,) = runner.reproduce(tmp_path, only=["profile-shape"], quick=True, progress=False)
    assert f.holds is True and not f.figures and "n = 256" in f.evidence
