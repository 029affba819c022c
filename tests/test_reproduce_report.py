"""`fairserve reproduce`: every file is written, verdicts come from the data, and missing data is said so."""
import pytest

from fairserve.cli import main
from fairserve.reproduce import report, runner
from fairserve.reproduce.experiments import EXPERIMENTS, Results
from fairserve.reproduce.runs import RunSpec, run

BY_NAME = {e.name: e for e in EXPERIMENTS}


def quick(workload, policy, **kw):
    return run(RunSpec(workload, policy, **kw), quick=True)


@pytest.mark.parametrize("name, workload, fair, unfair", [
    ("overload", "overload", "vtc", "fcfs"),
    ("on-off-overload", "on-off-overload", "vtc", "fcfs"),
    ("poisson-short-long", "poisson-short-long", "vtc", "fcfs"),
    ("proportional", "proportional", "vtc", "fcfs"),
    ("dist-shift", "dist-shift", "vtc", "lcf"),
])
def test_a_deliberately_unfair_result_does_not_hold(name, workload, fair, unfair):
    a, b = quick(workload, fair), quick(workload, unfair)
    honest = Results({(workload, fair): a, (workload, unfair): b})
    swapped = Results({(workload, fair): b, (workload, unfair): a})   # the baseline's outcome labelled as VTC
    assert report.judge(BY_NAME[name], honest)[0] is True
    assert report.judge(BY_NAME[name], swapped)[0] is False


def test_weighted_verdict_checks_both_splits():
    w, plain = quick("overload-weighted", "vtc"), quick("overload-weighted", "vtc", weighted=False)
    exp = BY_NAME["weighted"]
    assert report.judge(exp, Results({("overload-weighted", "weighted vtc"): w,
                                      ("overload-weighted", "vtc (no weights)"): plain}))[0] is True
    assert report.judge(exp, Results({("overload-weighted", "weighted vtc"): plain,
                                      ("overload-weighted", "vtc (no weights)"): w}))[0] is False


def test_missing_runs_are_not_evaluated_rather_than_crashing():
    holds, evidence = report.judge(BY_NAME["overload"], Results())
    assert holds is None and "could not be evaluated" in evidence


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
    assert page.count("data:image/png;base64,") == sum(len(f.figures) for f in findings)
    assert "<table>" in page and "Verdict: holds." in page


def test_report_says_does_not_hold(tmp_path):
    exp = BY_NAME["overload"]
    a, b = quick("overload", "vtc"), quick("overload", "fcfs")
    holds, evidence = report.judge(exp, Results({("overload", "vtc"): b, ("overload", "fcfs"): a}))
    report.write([report.Finding(exp, holds, evidence, [], [b, a])], tmp_path,
                 {"engine": "test", "mode": "quick", "runs": 2, "wall_s": 0.0})
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
    assert main(["reproduce", "--out", str(tmp_path), "--only", "weighted", "--quick", "--jobs", "1",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "weighted" in out and "holds" in out and "report.html" in out
    assert (tmp_path / "report.html").exists()
    assert main(["reproduce", "--only", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown experiment" in capsys.readouterr().err
    assert main(["reproduce", "--trace", "/no/such.csv", "--out", str(tmp_path)]) == 2
