"""`fairserve sweep` at scale: the 1,000 runs of benchmarks/sweep.toml (4 policies × 5 KV pools × 50 seeds of a
10-minute workload), each sweep into a fresh folder:

1. straight through with --jobs 2: wall time, and the runs' own simulation time summed;
2. interrupted (SIGINT to the process group, as Ctrl-C, once --stop-at of the runs are stored) and then resumed
   with the same command: the resumed sweep must run exactly the runs that were missing, leave the stored ones
   untouched, and write the same table as (1);
3. through Ray, on a head of its own on loopback in private network and process namespaces (scripts/ray_local.sh;
   Ray from scripts/ray_env.sh), --jobs CPUs: wall time, and the same table as (1);
4. side by side, --rounds rounds of a smaller sweep (--side-seeds seeds: 100 runs by default), the order rotated each
   round: one process (--jobs 1), a pool of --jobs processes, and Ray: median wall times and their ratios.

With Ray, the whole benchmark runs inside scripts/ray_local.sh (the head is up from start to end, also beside the
local sweeps) in the Ray venv's Python, so every sweep runs the same interpreter and libraries. Wall times are the
sweep command's, start to exit. Prints Markdown tables; --figure copies (1)'s figure of the largest backlogged
difference against the pool size (docs/results.md's: --figure docs/sweep-pools.png). --quick: 2 seeds (40 runs) and
1 seed side by side, 2 rounds.

Run: .venv/bin/python benchmarks/sweep.py [--quick] [--no-ray] [--jobs 2] [--rounds 3] [--side-seeds 5]
         [--stop-at 0.4] [--keep DIR] [--figure PNG]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "benchmarks" / "sweep.toml"
FIGURE = "kv_tokens-max_backlogged_diff.png"
INSIDE = "_FAIRSERVE_SWEEP_BENCH_INSIDE"  # set when this script runs beside its Ray head


def fairserve(out: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "fairserve", "sweep", str(SPEC), *args, "--out", str(out), "--no-progress"]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True)
    return time.perf_counter() - start, proc


def check(proc: subprocess.CompletedProcess[str], what: str) -> None:
    if proc.returncode != 0:
        sys.exit(f"sweep.py: {what} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def sweep(out: Path, args: list[str], what: str) -> float:
    """Run one sweep into a fresh `out`; its wall time."""
    shutil.rmtree(out, ignore_errors=True)
    wall, proc = timed(fairserve(out, args))
    check(proc, what)
    return wall


def table(out: Path) -> list[str]:
    """The sweep's table.csv without the commit it names (a commit between two sweeps of the same code changes no
    result; the code version stays in)."""
    lines = (out / "table.csv").read_text().splitlines()
    return [lines[0].partition(", commit ")[0], *lines[1:]]


def runs(out: Path) -> dict[str, int]:
    d = out / "runs"
    return {p.name: p.stat().st_mtime_ns for p in d.glob("*.json")} if d.is_dir() else {}


def run_seconds(out: Path) -> list[float]:
    return [json.loads(p.read_text())["result"]["wall_s"] for p in (out / "runs").glob("*.json")]


@dataclass
class Resumed:
    first_s: float  # until the interrupted sweep exited
    stored: int  # runs it had stored
    resume_s: float
    only_missing: bool  # the resumed sweep ran exactly the missing runs and left the stored ones untouched


def interrupted(out: Path, args: list[str], total: int, stop_at: float) -> Resumed:
    cmd = fairserve(out, args)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    while len(runs(out)) < stop_at * total:
        if proc.poll() is not None:
            sys.exit(f"sweep.py: the sweep ended before it could be interrupted:\n{proc.communicate()}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    first_s = time.perf_counter() - start
    if proc.returncode != 130 or "interrupted" not in err:
        sys.exit(f"sweep.py: the interrupted sweep exited {proc.returncode}:\n{err}")
    stored = runs(out)
    resume_s, done = timed(cmd)
    check(done, "the resumed sweep")
    after = runs(out)
    ok = (
        f"{len(stored):,} stored" in done.stdout
        and f"running {total - len(stored):,} on" in done.stdout
        and len(after) == total
        and all(after[n] == t for n, t in stored.items())
    )
    return Resumed(first_s, len(stored), resume_s, ok)


def side_by_side(work: Path, ways: dict[str, list[str]], rounds: int) -> dict[str, list[float]]:
    """Each way's wall times over `rounds`, the order rotated each round; every table must be the first one's."""
    walls: dict[str, list[float]] = {w: [] for w in ways}
    names = list(ways)
    reference: list[str] | None = None
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out = work / f"side-{r}-{len(walls[name])}-{names.index(name)}"
            walls[name].append(sweep(out, ways[name], f"the side-by-side sweep ({name})"))
            if reference is None:
                reference = table(out)
            elif table(out) != reference:
                sys.exit(f"sweep.py: the side-by-side sweep ({name}) wrote another table")
            shutil.rmtree(out)
    return walls


def outside(argv: list[str]) -> int:
    """Run this script again beside a private Ray head, in the Ray venv's Python."""
    raypy = subprocess.run([str(ROOT / "scripts" / "ray_env.sh")], capture_output=True, text=True)
    check(raypy, "scripts/ray_env.sh")
    python = raypy.stdout.strip()
    a = parse(argv)
    path = f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # the venv's `ray` CLI
    cmd = [str(ROOT / "scripts" / "ray_local.sh"), "--cpus", str(a.jobs), "--", python, __file__, *argv]
    return subprocess.run(cmd, env={**env(), "PATH": path, INSIDE: "1"}).returncode


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds (40 runs); 1 seed side by side, 2 rounds")
    ap.add_argument("--no-ray", action="store_true", help="leave out the Ray sweeps")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="rounds side by side (default: 3)")
    ap.add_argument("--side-seeds", type=int, default=5, help="seeds of the side-by-side sweep (default: 5)")
    ap.add_argument("--stop-at", type=float, default=0.4, help="interrupt once this share of the runs is stored")
    ap.add_argument("--keep", metavar="DIR", help="keep the sweeps' folders here (default: a removed temp dir)")
    ap.add_argument("--figure", metavar="PNG", help=f"copy the straight sweep's {FIGURE} here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    ray_address = os.environ.get("RAY_ADDRESS") if os.environ.get(INSIDE) == "1" else None
    if not a.no_ray and ray_address is None:
        return outside(argv)
    seeds = ["--seeds", "2"] if a.quick else []
    side_seeds, rounds = (1, 2) if a.quick else (a.side_seeds, a.rounds)
    total = 4 * 5 * (2 if a.quick else 50)
    jobs = ["--jobs", str(a.jobs)]
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="fairserve-sweep-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    on_ray = ["--ray", ray_address] if ray_address else []
    try:
        local_s = sweep(work / "local", [*seeds, *jobs], "the local sweep")
        reference = table(work / "local")
        sim = run_seconds(work / "local")
        shutil.rmtree(work / "resumed", ignore_errors=True)
        res = interrupted(work / "resumed", [*seeds, *jobs], total, a.stop_at)
        same_resumed = table(work / "resumed") == reference
        ray_s, same_ray = None, True
        if on_ray:
            ray_s = sweep(work / "ray", [*seeds, *on_ray], "the Ray sweep")
            same_ray = table(work / "ray") == reference
        if a.figure:
            shutil.copyfile(work / "local" / FIGURE, a.figure)
        side = ["--seeds", str(side_seeds), "--no-figures"]
        ways = {"1 process": [*side, "--jobs", "1"], f"{a.jobs} processes": [*side, *jobs]}
        if on_ray:
            ways[f"Ray, {a.jobs} CPUs"] = [*side, *on_ray]
        walls = side_by_side(work, ways, rounds)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    python = f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    print(f"`fairserve sweep benchmarks/sweep.toml` ({total:,} runs), {python}:\n")
    print("| sweep | wall s | runs | result |")
    print("|---|---:|---:|---|")
    print(f"| straight through, {a.jobs} local processes | {local_s:.1f} | {total:,} | table.csv (reference) |")
    print(
        f"| interrupted at {res.stored:,} stored, then resumed | {res.first_s:.1f} + {res.resume_s:.1f} | "
        f"{res.stored:,} + {total - res.stored:,} | "
        f"resumed ran only the missing runs: {'yes' if res.only_missing else 'NO'}; "
        f"same table: {'yes' if same_resumed else 'NO'} |"
    )
    if ray_s is not None:
        same = "yes" if same_ray else "NO"
        print(f"| Ray, a local head, {a.jobs} CPUs | {ray_s:.1f} | {total:,} | same table: {same} |")
    print(
        f"\nsimulation time per run (its own wall time, median / max): {statistics.median(sim):.2f} / "
        f"{max(sim):.2f} s; summed {sum(sim):.0f} s = {sum(sim) / (a.jobs * local_s):.0%} of {a.jobs} × the "
        "straight sweep's wall time\n"
    )
    side_runs = 4 * 5 * side_seeds
    med = {w: statistics.median(v) for w, v in walls.items()}
    first = next(iter(med))
    print(f"Side by side: `--seeds {side_seeds}` ({side_runs:,} runs), {rounds} rounds, order rotated; same table:\n")
    print("| runner | median wall s | runs/s | speed-up vs 1 process | all rounds (s) |")
    print("|---|---:|---:|---:|---|")
    for w, m in med.items():
        rounds_text = ", ".join(f"{x:.1f}" for x in walls[w])
        print(f"| {w} | {m:.1f} | {side_runs / m:.1f} | {med[first] / m:.2f}× | {rounds_text} |")
    failed = not res.only_missing or not same_resumed or not same_ray
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
