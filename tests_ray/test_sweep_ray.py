"""`fairserve sweep --ray` on a real Ray cluster: a head started for the test (scripts/ray_local.sh: loopback only, in
private network and process namespaces, so nothing can reach another host and `ray stop` touches no other Ray) runs
the sweep's simulations as Ray tasks, gives the very table the local processes give, and resumes the same way.

Runs in the venv of scripts/ray_env.sh (scripts/ray_tests.sh). Under CI=true a missing Ray, a missing `unshare` or
a head that does not start fails the test; elsewhere the test is skipped with the reason."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI = os.environ.get("CI") == "true"
ARGS = ["--policy", "vtc,fcfs", "--workload", "overload", "--duration", "30", "--kv-tokens", "5000,20000",
        "--seeds", "3", "--no-progress", "--no-figures"]  # fmt: skip
RUNS = 2 * 2 * 3


def unavailable(why: str) -> None:
    if CI:
        pytest.fail(why)
    pytest.skip(why)


def test_a_sweep_on_ray_gives_the_local_table_and_resumes(tmp_path):
    try:
        import ray  # noqa: F401
    except ImportError:
        unavailable("Ray is not installed in this Python: run the tier with scripts/ray_tests.sh")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # the venv's `ray` CLI
    }
    local = subprocess.run(
        [sys.executable, "-m", "fairserve", "sweep", *ARGS, "--jobs", "2", "--out", str(tmp_path / "local")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    sweep = shlex.join([sys.executable, "-m", "fairserve", "sweep", *ARGS, "--out", str(tmp_path / "ray")])
    runs = shlex.quote(str(tmp_path / "ray" / "runs"))
    inner = f"""set -e
ip -o link show > {shlex.quote(str(tmp_path / "links.txt"))}
{sweep} --ray "$RAY_ADDRESS"
ls {runs} | head -n 3 | while read -r f; do rm {runs}/"$f"; done
{sweep} --ray "$RAY_ADDRESS"
"""
    proc = subprocess.run(
        [str(ROOT / "scripts" / "ray_local.sh"), "--cpus", "2", "--", "bash", "-c", inner],
        env=env, capture_output=True, text=True, timeout=420,
    )  # fmt: skip
    if proc.returncode == 97:
        unavailable(f"no private Ray head could be started: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    links = (tmp_path / "links.txt").read_text().splitlines()
    assert [line.split(":")[1].strip() for line in links] == ["lo"]  # the sweep's only network: loopback
    on_ray = "on the Ray cluster at 127.0.0.1:6379 (2 CPUs)"
    assert f"{RUNS} runs" in proc.stdout and f"running {RUNS} {on_ray}" in proc.stdout
    assert f"{RUNS - 3} stored" in proc.stdout and f"running 3 {on_ray}" in proc.stdout
    for name in ("table.csv", "table.md", "runs.csv"):
        assert (tmp_path / "ray" / name).read_text() == (tmp_path / "local" / name).read_text(), name
    records = [json.loads(p.read_text()) for p in (tmp_path / "ray" / "runs").glob("*.json")]
    assert len(records) == RUNS and {r["executor"] for r in records} == {on_ray[len("on ") :]}
    assert json.loads((tmp_path / "ray" / "sweep.json").read_text())["executor"] == on_ray[len("on ") :]
