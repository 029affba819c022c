"""Before/after in one run: the simulator's speed of two checkouts of fairserve, interleaved.

Each repeat runs, for both trees in turn (alternating which goes first), one process per tree that times
`simulate()` on each (workload, policy) after a warm-up, and one process per tree that times the emulator's engine
step (400 requests from 20 tenants, `advance()` until idle). The table gives medians over repeats and the ratio
after/before. Make the "before" tree with `git worktree add /tmp/before REV`.

Run: .venv/bin/python benchmarks/compare_trees.py /tmp/before . [--repeats 10] [--workloads real,overload]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

TIME_SIM = """
import gc, sys, time
from fairserve.sim import simulate
from fairserve.workloads import get_workload
runs = [(w, p) for w in sys.argv[1].split(",") for p in sys.argv[2].split(",")]
work = {w: get_workload(w) for w, _ in runs}
simulate(work[runs[0][0]], runs[0][1])
for w, p in runs:
    gc.collect(); t0 = time.perf_counter(); simulate(work[w], p); print(w, p, time.perf_counter() - t0)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="the checkout measured first (its src/ is imported)")
    ap.add_argument("after", type=Path, help="the checkout compared with it")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--workloads", default="real,overload")
    ap.add_argument("--policies", default="vtc,fcfs")
    a = ap.parse_args(argv)
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    for name, tree in trees.items():
        if not (tree / "src" / "fairserve").is_dir():
            ap.error(f"{name}: {tree} has no src/fairserve")
    times: dict[tuple[str, str, str], list[float]] = {}
    for i in range(a.repeats):
        for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
            env = dict(os.environ, PYTHONPATH=str(trees[name] / "src"))
            jobs = [[TIME_SIM, a.workloads, a.policies]] + [[TIME_EMULATOR_STEP, p] for p in a.policies.split(",")]
            for script, *args in jobs:
                out = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True)
                if out.returncode:
                    print(out.stderr, file=sys.stderr)
                    return 1
                for line in out.stdout.splitlines():
                    w, p, t = line.split()
                    times.setdefault((w, p, name), []).append(float(t))
    print(f"{a.repeats} interleaved repeats, medians (s per simulate(); µs per emulator step)\n")
    print("| run | policy | before | after | after / before |")
    print("|---|---|---:|---:|---:|")
    for w, p in sorted({(w, p) for w, p, _ in times}):
        b, f = statistics.median(times[w, p, "before"]), statistics.median(times[w, p, "after"])
        print(f"| {w} | {p} | {b:.4f} | {f:.4f} | {f / b:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
