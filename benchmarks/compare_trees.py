"""Before/after in one run: the simulator's speed of two checkouts of fairserve, interleaved.

Each repeat runs, for both trees in turn (alternating which goes first), one process per tree that times
`simulate()` on each (workload, policy) after a warm-up (to the workload's duration, or with `--drain` until every
request is done), and one process per tree that times the emulator's engine
step (400 requests from 20 tenants, `advance()` until idle). The table gives medians over repeats and the ratio
after/before. Make the "before" tree with `git worktree add /tmp/before REV`.

`--reproduce` instead times `fairserve reproduce` (full, or `--quick` with `--quick`; 1 worker process), each tree's
in turn, on the experiments both trees have: CPU seconds (user + system of the process and its children) and wall
seconds, with the load average.

Run: .venv/bin/python benchmarks/compare_trees.py /tmp/before . [--repeats 10] [--workloads real,overload] [--drain]
     .venv/bin/python benchmarks/compare_trees.py /tmp/before . --reproduce [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIME_SIM = """
import gc, sys, time
from fairserve.sim import simulate
from fairserve.workloads import get_workload
runs = [(w, p) for w in sys.argv[1].split(",") for p in sys.argv[2].split(",")]
work = {w: get_workload(w) for w, _ in runs}
drain = sys.argv[3] == "drain"
simulate(work[runs[0][0]], runs[0][1], drain=drain)
for w, p in runs:
    gc.collect(); t0 = time.perf_counter(); simulate(work[w], p, drain=drain); print(w, p, time.perf_counter() - t0)
"""

TIME_EMULATOR_STEP = """
import sys, time
from fairserve.emulate.config import EmulatorConfig
from fairserve.emulate.driver import Emulator
em = Emulator(EmulatorConfig(policy=sys.argv[1]))
for i in range(400):
    em.submit(f"r{i}", f"c{i % 20}", 100 + (i * 37) % 300, 50 + (i * 53) % 200)
steps, t0 = 0, time.perf_counter()
while em.engine.advance():
    em._deliver()
    steps += 1
print("emulator-step-us", sys.argv[1], (time.perf_counter() - t0) / steps * 1e6)
"""


def experiments(tree: Path) -> list[str]:
    """The names of `tree`'s reproduce experiments, in its order."""
    code = "from fairserve.reproduce.runner import ALL_EXPERIMENTS; print(','.join(e.name for e in ALL_EXPERIMENTS))"
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip().split(",")


def time_reproduce(tree: Path, quick: bool, only: list[str]) -> tuple[float, float]:
    """One `fairserve reproduce --only ONLY` of `tree` in a child process (1 worker): (CPU seconds, wall seconds)."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "fairserve", "reproduce", "--out", out, "--jobs", "1", "--no-progress"]
        cmd += ["--only", ",".join(only)]
        start = time.perf_counter()
        subprocess.run(cmd + (["--quick"] if quick else []), env=env, check=True, capture_output=True)
        wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def compare_reproduce(trees: dict[str, Path], repeats: int, quick: bool) -> int:
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    wall: dict[str, list[float]] = {"before": [], "after": []}
    # NOTE: the experiments both trees have, so that both run the same suite
    names = {name: experiments(tree) for name, tree in trees.items()}
    only = [e for e in names["before"] if e in names["after"]]
    left = sorted(set(names["before"]) ^ set(names["after"]))
    loads = [os.getloadavg()[0]]
    for i in range(repeats):
        for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
            c, w = time_reproduce(trees[name], quick, only)
            cpu[name].append(c)
            wall[name].append(w)
            loads.append(os.getloadavg()[0])
    mode = "--quick" if quick else "full"
    print(f"`fairserve reproduce` ({mode}, 1 worker), {repeats} interleaved repeats, medians (min-max)")
    print(f"{len(only)} experiments, those both trees have" + (f" (left out: {', '.join(left)})" if left else ""))
    print(f"load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores\n")
    print("| tree | CPU s | wall s |")
    print("|---|---:|---:|")
    for name in ("before", "after"):
        print(
            f"| {name} | {statistics.median(cpu[name]):.1f} ({min(cpu[name]):.1f}-{max(cpu[name]):.1f}) "
            f"| {statistics.median(wall[name]):.1f} ({min(wall[name]):.1f}-{max(wall[name]):.1f}) |"
        )
    ratio = statistics.median(cpu["after"]) / statistics.median(cpu["before"])
    print(f"\nCPU after / before: {ratio:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="the checkout measured first (its src/ is imported)")
    ap.add_argument("after", type=Path, help="the checkout compared with it")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--workloads", default="real,overload")
    ap.add_argument("--policies", default="vtc,fcfs")
    ap.add_argument("--drain", action="store_true", help="run each simulation until every request is done")
    ap.add_argument("--reproduce", action="store_true", help="time `fairserve reproduce` instead")
    ap.add_argument("--quick", action="store_true", help="with --reproduce: its --quick suite")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {a.repeats}")
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    for name, tree in trees.items():
        if not (tree / "src" / "fairserve").is_dir():
            ap.error(f"{name}: {tree} has no src/fairserve")
    if a.reproduce:
        return compare_reproduce(trees, a.repeats, a.quick)
    times: dict[tuple[str, str, str], list[float]] = {}
    for i in range(a.repeats):
        for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
            env = dict(os.environ, PYTHONPATH=str(trees[name] / "src"))
            until = "drain" if a.drain else "duration"
            jobs = [[TIME_SIM, a.workloads, a.policies, until]]
            jobs += [[TIME_EMULATOR_STEP, p] for p in a.policies.split(",")]
            for script, *args in jobs:
                out = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True)
                if out.returncode:
                    print(out.stderr, file=sys.stderr)
                    return 1
                for line in out.stdout.splitlines():
                    w, p, t = line.split()
                    times.setdefault((w, p, name), []).append(float(t))
    until = "until every request is done" if a.drain else "to the workload's duration"
    print(f"{a.repeats} interleaved repeats, medians (s per simulate(), {until}; µs per emulator step)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores\n")
    print("| run | policy | before | after | after / before |")
    print("|---|---|---:|---:|---:|")
    for w, p in sorted({(w, p) for w, p, _ in times}):
        b, f = statistics.median(times[w, p, "before"]), statistics.median(times[w, p, "after"])
        print(f"| {w} | {p} | {b:.4f} | {f:.4f} | {f / b:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
