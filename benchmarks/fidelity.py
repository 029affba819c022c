"""Fidelity: the four calibration runs against the paper's measurements, throughput of every named workload under
FCFS and VTC, and of RPM limits on the `real` trace.

Calibration: the paper's artifact measured on an A10G (`fairserve.sim.calibration.CALIBRATION_RUNS`), simulated with
the default preset and counted as the paper's plots count service (over [first token, finish] overlapping the
window); error = simulated / measured - 1. For each workload (its own duration, pool and hardware profile): output
tokens/s and service/s (w_p=1, w_q=2) per policy, and the VTC/FCFS ratio. For `real`: RPM limits and their output
tokens/s as a fraction of VTC's (the paper's headline on its original trace: RPM 5 ≈ 44% of VTC, 340 vs 779
tokens/s). Simulations are deterministic (seed 0), so each runs once, spread over --jobs processes. `real` needs the
Arena trace; without it, it is skipped with a message.

Run: .venv/bin/python benchmarks/fidelity.py [--quick] [--jobs 2] [--workloads overload,real] [--rpm 5,10,15,20,30]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from functools import cache

from fairserve.metrics import summarize
from fairserve.sim import simulate
from fairserve.sim.calibration import CALIBRATION_RUNS, CalibrationResult, MeasuredRun, simulate_run
from fairserve.workloads import ALL_WORKLOADS, Workload, WorkloadError, get_workload

RPM_LIMITS = (5, 10, 15, 20, 30)
QUICK_WORKLOADS = ("overload", "overload-multi", "overload-weighted", "real")
PAPER = {"vtc": 779.0, "rpm:5": 340.0}  # output tokens/s on the paper's original Arena trace


@cache
def _workload(name: str) -> Workload:
    return get_workload(name)


def _run(name: str, policy: str) -> tuple[float, float, int, int]:
    """(output tokens/s, service/s, rejected requests, requests) of one simulation."""
    w = _workload(name)
    res = simulate(w, policy)
    s = summarize(res.records, w.duration_s, weights=w.weights)
    return s.output_tokens_per_s, s.service_per_s, sum(r.status == "rejected" for r in res.records), len(res.records)


def _calibrate(run: MeasuredRun) -> CalibrationResult:
    return simulate_run(run)


def print_calibration(results: list[CalibrationResult]) -> None:
    print("Calibration runs (the paper's artifact, A10G / Llama-2-7b; service = prompt + 2 × output tokens per s):\n")
    print("| run | window | measured service/s | simulated | error | measured out tok/s | simulated |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in results:
        r = c.run
        print(
            f"| `{r.workload}`, {r.policy.upper()} | {r.window_s:.0f} s | {r.service_per_s:.0f} | "
            f"{c.service_per_s:.0f} | {c.error:+.1%} | {r.output_tokens_per_s:.1f} | {c.output_tokens_per_s:.1f} |"
        )
    print(f"\nmax |error| {max(abs(c.error) for c in results):.1%}\n")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_WORKLOADS)} and RPM 5, 20 (< 20 s)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--workloads", help=f"comma-separated (default: all): {', '.join(ALL_WORKLOADS)}")
    ap.add_argument("--rpm", help="comma-separated RPM limits to run on `real` (default 5,10,15,20,30)")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {a.jobs}")
    names = (
        [x.strip() for x in a.workloads.split(",") if x.strip()]
        if a.workloads
        else list(QUICK_WORKLOADS if a.quick else ALL_WORKLOADS)
    )
    for name in names or ap.error("--workloads is empty"):
        if name not in ALL_WORKLOADS:
            ap.error(f"unknown workload {name!r}; choose from: {', '.join(ALL_WORKLOADS)}")
    try:
        limits = [int(x) for x in a.rpm.split(",")] if a.rpm else ([5, 20] if a.quick else list(RPM_LIMITS))
    except ValueError:
        ap.error(f"--rpm must be comma-separated integers, got {a.rpm!r}")
    if any(n < 1 for n in limits):
        ap.error("--rpm limits must be >= 1")
    if "real" in names:
        try:
            _workload("real")
        except WorkloadError as e:
            print(f"> skipped `real`: {e}\n")
            names.remove("real")
    if not names:
        ap.error("no workload left to run")

    jobs = [(n, p) for n in names for p in ("fcfs", "vtc")]
    jobs += [("real", f"rpm:{k}") for k in limits] if "real" in names else []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        calibration = [pool.submit(_calibrate, r) for r in CALIBRATION_RUNS]
        futures = {job: pool.submit(_run, *job) for job in jobs}
        out = {job: f.result() for job, f in futures.items()}
        calibrated = [f.result() for f in calibration]
    wall = time.perf_counter() - t0

    print(f"{len(jobs) + len(calibrated)} simulations in {wall:.1f} s on {a.jobs} processes.\n")
    print_calibration(calibrated)
    print("Every workload, its whole duration (service = prompt + 2 × output tokens, tokens produced by its end):\n")
    print(
        "| workload | FCFS out tok/s | VTC out tok/s | VTC/FCFS out | FCFS service/s | VTC service/s "
        "| VTC/FCFS service |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in names:
        (fo, fs, _, _), (vo, vs, _, _) = out[n, "fcfs"], out[n, "vtc"]
        print(f"| {n} | {fo:.1f} | {vo:.1f} | {_ratio(vo, fo)} | {fs:.1f} | {vs:.1f} | {_ratio(vs, fs)} |")
    if "real" not in names:
        return 0
    vtc_out = out["real", "vtc"][0]
    print(
        "\n`real` (Chatbot Arena trace): RPM limits vs VTC. Paper, on its original trace: RPM 5 = 340 vs "
        f"VTC 779 tokens/s ({PAPER['rpm:5'] / PAPER['vtc']:.0%}).\n"
    )
    print("| policy | out tok/s | service/s | rejected / requests | out tok/s ÷ VTC | paper |")
    print("|---|---:|---:|---:|---:|---:|")
    for p in ["vtc", "fcfs", *(f"rpm:{k}" for k in limits)]:
        o, s, rej, total = out["real", p]
        paper = f"{PAPER[p]:.0f} ({PAPER[p] / PAPER['vtc']:.0%})" if p in PAPER else ""
        print(f"| {p} | {o:.1f} | {s:.1f} | {rej:,} / {total:,} | {o / vtc_out:.0%} | {paper} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
