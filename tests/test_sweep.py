"""`fairserve sweep`: the grid, resumption (only what is missing runs, after a real Ctrl-C too), invalidation by a
code change or a changed trace, the confidence interval over seeds, and the files with their recorded configuration.
(The Ray executor is tested against a real cluster in tests_ray/.)"""

import csv
import fcntl
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from fairserve.cli import main
from fairserve.sweep import from_mapping, load_toml, mean_ci, parse_seeds, source_digest, t_quantile
from fairserve.sweep import run as sweep_run
from fairserve.sweep.store import PACKAGE
from fairserve.sweep.work import Task, WorkerMismatch, execute

pytestmark = pytest.mark.integration

SRC = PACKAGE.parent
SMALL = ["--policy", "vtc,fcfs", "--workload", "overload", "--duration", "30", "--kv-tokens", "5000,10000"]
WEIGHTS = ["--weights", "default", "--weights", "client-0=2,client-1=1"]


def sweep(out: Path, *extra: str) -> int:
    return main(["sweep", *SMALL, *extra, "--out", str(out), "--jobs", "1", "--no-progress"])


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep shared by the tests that read it (they copy it to change it): 2 policies x 2 pools x 2 weightings x
    3 seeds, with figures; made once per session, also across pytest-xdist workers."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # NOTE: the session's folder, above each worker's own
    out = root / "shared-sweep"
    with open(root / "shared-sweep.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "sweep.json").exists():
            assert sweep(out, "--seeds", "3", *WEIGHTS) == 0
    return out


def run_files(out: Path) -> dict[str, int]:
    """run file -> its modification time (ns)."""
    return {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}


def table(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))


def header(path: Path) -> dict[str, str]:
    lines = [line[2:] for line in path.read_text().splitlines() if line.startswith("# ")]
    return {k: v for k, _, v in (line.partition(": ") for line in lines)}


def test_t_quantiles_match_the_tables_and_the_interval_covers_95_percent():
    for df, t in [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452), (49, 2.0096), (1000, 1.9623)]:
        assert t_quantile(0.975, df) == pytest.approx(t, abs=5e-5)
    assert t_quantile(0.025, 4) == pytest.approx(-2.7764, abs=5e-5)
    iv = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (iv.mean, iv.n) == (3.0, 5) and iv.half == pytest.approx(2.7764451 * math.sqrt(2.5) / math.sqrt(5))
    assert math.isnan(mean_ci([7.0]).half) and mean_ci([7.0]).mean == 7.0 and mean_ci([]).n == 0
    rng = np.random.default_rng(1)  # 5 normal draws: t's interval covers the mean 95% of the time (z's: ~88%)
    covered = 0
    for _ in range(3000):
        iv = mean_ci(rng.normal(10.0, 3.0, 5).tolist())
        covered += iv.low <= 10.0 <= iv.high
    assert 0.935 <= covered / 3000 <= 0.965


def test_the_table_aggregates_each_point_over_its_seeds(swept):
    runs, rows = table(swept / "runs.csv"), table(swept / "table.csv")
    assert len(runs) == 24 and len(rows) == 8 and {r["seed"] for r in runs} == {"0", "1", "2"}
    t2 = 4.302652729749411  # t(0.975, 2 degrees of freedom)
    group = ("policy", "kv_tokens", "weights")
    for row in rows:
        mine = [r for r in runs if all(r[k] == row[k] for k in group)]
        assert len(mine) == 3 and row["seeds"] == "3"
        for metric in ("throughput_tok_s", "max_backlogged_diff", "ttft_p90_s"):
            xs = np.array([float(r[metric]) for r in mine])
            assert float(row[f"{metric}_mean"]) == pytest.approx(xs.mean(), rel=1e-12)
            assert float(row[f"{metric}_ci95"]) == pytest.approx(t2 * xs.std(ddof=1) / math.sqrt(3), rel=1e-9)
            assert row[f"{metric}_n"] == "3"
    # the runs are real: FCFS's largest backlogged difference is well above VTC's at each pool
    by = {
        (r["policy"], r["kv_tokens"]): float(r["max_backlogged_diff_mean"]) for r in rows if r["weights"] == "default"
    }
    assert all(by["fcfs", kv] > 1.5 * by["vtc", kv] for kv in ("5000", "10000"))


def test_every_file_records_version_seeds_and_configuration(swept):
    manifest = json.loads((swept / "sweep.json").read_text())
    config, version = manifest["config"], manifest["fairserve"]
    assert version == sweep_run.code_version() and version.endswith(source_digest())
    assert config["policies"] == ["vtc", "fcfs"] and config["kv_tokens"] == [5000, 10000]
    assert config["weights"] == ["default", "client-0=2,client-1=1"] and config["duration"] == 30.0
    assert manifest["seeds"] == [0, 1, 2] and manifest["runs"] == 24 and manifest["ran"] == 24
    for name in ("table.csv", "runs.csv"):
        h = header(swept / name)
        assert json.loads(h["config"]) == config and h["seeds"] == "0-2 (3 seeds); runs: 24"
        assert (swept / name).read_text().startswith(f"# fairserve {version}")
    md = (swept / "table.md").read_text()
    assert f"fairserve {version}" in md and json.dumps(config, sort_keys=True) in md and "0-2 (3 seeds)" in md
    assert "| vtc | overload | 5000 | client-0=2,client-1=1 | 3 |" in md
    figures = sorted(p.name for p in swept.glob("*.png"))
    metrics = ("jain_index", "max_backlogged_diff", "throughput_tok_s", "ttft_p90_s")
    assert figures == sorted(f"{axis}-{m}.png" for axis in ("kv_tokens", "weights") for m in metrics)
    assert sorted(f for f in manifest["files"] if f.endswith(".png")) == figures
    for name in figures:
        assert f"[{name}]({name})" in md
        with Image.open(swept / name) as im:
            assert im.size[0] > 400
            text = im.text["Description"]
            assert f"fairserve {version}" in text and json.dumps(config, sort_keys=True) in text


def test_resuming_runs_only_what_is_missing(swept, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(swept, out)
    before = run_files(out)
    gone = sorted(before)[:3]
    for name in gone:
        (out / "runs" / name).unlink()
    capsys.readouterr()
    assert sweep(out, "--seeds", "3", *WEIGHTS, "--no-figures") == 0
    text = capsys.readouterr().out
    assert "24 runs" in text and "21 stored" in text and "running 3 on 1 local process" in text
    after = run_files(out)
    assert after.keys() == before.keys()
    assert all(after[n] == before[n] for n in before if n not in gone)  # untouched
    assert (out / "table.csv").read_text() == (swept / "table.csv").read_text()
    assert sweep(out, "--seeds", "4", "--no-figures") == 0  # one more seed, the default weights only: its 4 runs
    assert "12 stored" in (text := capsys.readouterr().out) and "running 4 on" in text
    assert sweep(out, "--seeds", "4", "--no-figures") == 0
    assert "16 stored" in (text := capsys.readouterr().out) and "ran 0 runs" in text


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_keeps_every_finished_run_and_the_same_command_resumes(tmp_path, capsys):
    out = tmp_path / "out"
    # NOTE: 300 s workloads: runs of a few ms each could all finish before the signal arrives
    args = ["sweep", "--policy", "vtc,fcfs,lcf,drr", "--workload", "overload", "--duration", "300", "--kv-tokens",
            "5000,10000", "--seeds", "4", "--out", str(out), "--no-progress", "--no-figures"]  # fmt: skip
    cmd = [sys.executable, "-m", "fairserve", *args, "--jobs", "2"]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    # NOTE: Ctrl-C's default restored in the child: a disposition of SIG_IGN left in this process by an earlier test
    # would be inherited, and Python keeps an ignored SIGINT ignored
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)  # fmt: skip
    deadline = time.monotonic() + 60
    while len(run_files(out) if (out / "runs").is_dir() else {}) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted:" in err and "the same command resumes it" in err and "Traceback" not in err
    assert workers and not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    stored = run_files(out)
    assert 2 <= len(stored) < 32 and not list((out / "runs").glob(".*.tmp"))
    assert all(json.loads((out / "runs" / n).read_text())["key"] == n[:-5] for n in stored)
    capsys.readouterr()
    assert main([*args, "--jobs", "1"]) == 0  # the same grid, resumed in this process
    text = capsys.readouterr().out
    assert f"{len(stored)} stored" in text and f"running {32 - len(stored)} on 1 local process" in text
    after = run_files(out)
    assert len(after) == 32 and all(after[n] == t for n, t in stored.items())


def test_a_code_change_without_a_version_bump_runs_everything_again(swept, tmp_path, monkeypatch, capsys):
    src = tmp_path / "fairserve"
    shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("__pycache__"))
    assert source_digest(src) == source_digest()
    engine = src / "sim" / "engine.py"
    engine.write_text(engine.read_text() + "\n# a comment: the code changed, the version did not\n")
    edited = source_digest(src)
    assert edited != source_digest()
    out = tmp_path / "out"
    shutil.copytree(swept, out)
    release = sweep_run.code_version().partition("+")[0]
    # NOTE: the version of the edited tree, as code_version() computes it for code run from there
    monkeypatch.setattr(sweep_run, "code_version", lambda: f"{release}+src.{edited}")
    capsys.readouterr()
    assert sweep(out, "--seeds", "3", *WEIGHTS, "--no-figures") == 0
    text = capsys.readouterr().out
    assert "0 stored" in text and "removed 24 stale results" in text and "running 24 on" in text
    versions = {json.loads(p.read_text())["version"] for p in (out / "runs").glob("*.json")}
    assert versions == {f"{release}+src.{edited}"} == {json.loads((out / "sweep.json").read_text())["fairserve"]}
    assert len(list((out / "runs").glob("*.json"))) == 24
    assert (out / "table.csv").read_text().startswith(f"# fairserve {release}+src.{edited}")


def test_a_changed_trace_file_runs_again_and_a_sweep_file_works_with_flags(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    rows = [f"{i * 0.5:.3f},client-{i % 3},{64 + i % 7},{32 + i % 5}" for i in range(120)]
    trace.write_text("arrival_time_s,client,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    spec = tmp_path / "sweep.toml"
    spec.write_text(
        'policies = ["vtc", "fcfs"]\ntraces = ["t.csv"]\nkv_tokens = [3000]\nseeds = "0-1"\n'
        'weights = ["default", {client-0 = 3}]\n'
    )
    out = ["--out", str(tmp_path / "out"), "--jobs", "1", "--no-progress", "--no-figures"]
    assert main(["sweep", str(spec), *out]) == 0
    assert "8 runs (2 policies × 1 workload × 1 pool × 2 weightings × 2 seeds)" in capsys.readouterr().out
    rows_ = table(tmp_path / "out" / "table.csv")
    assert {r["workload"] for r in rows_} == {"t.csv"} and {r["weights"] for r in rows_} == {"default", "client-0=3"}
    assert main(["sweep", str(spec), "--policy", "vtc", *out]) == 0  # a flag replaces its key
    assert "4 runs" in (text := capsys.readouterr().out) and "4 stored" in text and "ran 0" in text
    trace.write_text(trace.read_text().replace("client-2,64", "client-2,65"))
    assert main(["sweep", str(spec), *out]) == 0
    assert "0 stored" in (text := capsys.readouterr().out) and "running 8 on" in text


def test_failed_runs_are_reported_and_the_rest_kept(tmp_path, monkeypatch, capsys):
    real = sweep_run.execute

    def flaky(task):
        if task.point.policy == "fcfs" and task.point.seed == 1:
            raise RuntimeError("simulated failure")
        return real(task)

    monkeypatch.setattr(sweep_run, "execute", flaky)
    assert sweep(tmp_path / "out", "--seeds", "2", "--no-figures") == 1
    err = capsys.readouterr().err
    assert "2 of 8 runs failed (6 of 8 are stored" in err and "RuntimeError: simulated failure" in err
    assert "policy fcfs" in err and "seed 1" in err and not (tmp_path / "out" / "table.csv").exists()
    monkeypatch.setattr(sweep_run, "execute", real)
    assert sweep(tmp_path / "out", "--seeds", "2", "--no-figures") == 0
    assert "6 stored" in (text := capsys.readouterr().out) and "running 2 on" in text


def test_a_worker_running_other_code_refuses():
    (point,) = from_mapping({"policies": "vtc", "workloads": "overload", "duration": 30}).points()
    with pytest.raises(WorkerMismatch, match="other fairserve code"):
        execute(Task(point, None, "0" * 16))
    assert execute(Task(point, None, source_digest()))["metrics"]["throughput_tok_s"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "nope", "--workload", "overload"], "unknown policy 'nope'"),
        (["--policy", "vtc", "--workload", "nope"], "unknown workload 'nope'"),
        (["--policy", "vtc"], "needs a workload or a trace"),
        (["--workload", "overload"], "needs at least one policy"),
        (["--policy", "vtc", "--trace", "/no/such.csv"], "trace file not found: /no/such.csv"),
        (["--policy", "vtc", "--workload", "overload", "--seeds", "5-2"], "seeds: expected N, A-B"),
        (["--policy", "vtc", "--workload", "overload", "--seeds", "x"], "seeds: expected N, A-B"),
        (["--policy", "vtc", "--workload", "overload", "--kv-tokens", "0"], "kv_tokens: expected whole numbers"),
        (["--policy", "vtc,vtc", "--workload", "overload"], "policies lists 'vtc' twice"),
        (["--policy", "vtc", "--workload", "overload", "--weights", "bob=2"], "'bob' names no tenant or group"),
        (["--policy", "vtc", "--workload", "overload", "--weights", "client-0=x"], "bad weights entry"),
        (["--policy", "vtc", "--workload", "overload", "--profile", "nope"], "nope"),
        (["--policy", "vtc", "--workload", "overload", "--ray", "127.0.0.1:1"], "Ray"),
        (["--policy", "fcfs:preempt=500", "--workload", "overload"], "policy 'fcfs' keeps none; use vtc"),
        (["--policy", "dlpm", "--workload", "overload", "--engine-mode", "paged"], "needs the prefix cache"),
        (["--policy", "vtc", "--workload", "overload", "--prefix-cache"], "--prefix-cache needs --engine-mode paged"),
    ],
)
def test_bad_input_gets_one_line_and_status_2(tmp_path, capsys, args, message):
    assert main(["sweep", *args, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fairserve: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "o" / "runs").exists()


def test_sweep_files_are_checked(tmp_path):
    bad = tmp_path / "s.toml"
    bad.write_text('policies = ["vtc"]\nworkload = ["overload"]\n')
    with pytest.raises(ValueError, match="unknown key 'workload'"):
        load_toml(bad)
    bad.write_text("policies = [\n")
    with pytest.raises(ValueError, match="not a valid TOML file"):
        load_toml(bad)
    with pytest.raises(ValueError, match="not found"):
        load_toml(tmp_path / "none.toml")
    assert parse_seeds(3) == (0, 1, 2) and parse_seeds("4-6") == (4, 5, 6) and parse_seeds("7,2") == (7, 2)
    assert parse_seeds([1, 9]) == (1, 9) and parse_seeds("2") == (0, 1)


def test_engine_options_and_the_prefix_cache_are_swept(tmp_path):
    """Preemption (`vtc:preempt=500`) and the prefix cache run through the command as through `simulate`."""
    out = tmp_path / "o"
    args = ["--policy", "vtc,vtc:preempt=500", "--workload", "overload", "--duration", "30", "--no-figures"]
    assert main(["sweep", *args, "--out", str(out), "--jobs", "1", "--no-progress"]) == 0
    rows = {r["policy"]: r for r in table(out / "table.csv")}
    assert float(rows["vtc:preempt=500"]["max_backlogged_diff_mean"]) < float(rows["vtc"]["max_backlogged_diff_mean"])
    cached = ["--policy", "vtc,dlpm", "--workload", "system-prompts", "--duration", "30", "--kv-tokens", "4384"]
    cached += ["--engine-mode", "paged", "--prefix-cache", "--no-figures"]
    assert main(["sweep", *cached, "--out", str(tmp_path / "c"), "--jobs", "1", "--no-progress"]) == 0
    rows = {r["policy"]: r for r in table(tmp_path / "c" / "table.csv")}
    assert float(rows["dlpm"]["service_per_s_mean"]) > float(rows["vtc"]["service_per_s_mean"])


def test_a_fleet_is_swept_with_its_cost(tmp_path):
    """`--engines`, `--dispatch` and `--autoscale` reach every run; the table gives the fleet's engine-seconds."""
    out = tmp_path / "f"
    args = ["--policy", "vtc,fcfs", "--workload", "overload", "--duration", "30", "--no-figures", "--engines", "2"]
    args += ["--dispatch", "shard:1", "--autoscale", "1:3", "--scale-delay", "5"]
    assert main(["sweep", *args, "--out", str(out), "--jobs", "1", "--no-progress"]) == 0
    rows = {r["policy"]: r for r in table(out / "table.csv")}
    # NOTE: two engines at start, at most three, for the run's 30 s or more
    assert all(60 <= float(r["engine_seconds_mean"]) for r in rows.values())
    spec = json.loads(next((out / "runs").glob("*.json")).read_text())["spec"]
    assert (spec["engines"], spec["dispatch"], spec["autoscale"], spec["scale_delay_s"]) == (2, "shard:1", "1:3", 5.0)
    assert main(["sweep", "--policy", "vtc", "--workload", "overload", "--dispatch", "shard:1", "--out", str(out)]) == 2
