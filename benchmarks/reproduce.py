"""Wall time of `fairserve reproduce`, full and --quick, with 1 and 2 worker processes (median of repeats).

Targets (issue 3): the whole default suite in < 60 s on a 2-core machine, --quick in < 10 s.
Run: .venv/bin/python benchmarks/reproduce.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from fairserve.reproduce import reproduce


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if args.repeats < 1:
        print("benchmarks/reproduce.py: --repeats must be >= 1", file=sys.stderr)
        return 2
    print("| mode | jobs | wall s (median) | min | verdicts holding |")
    print("|---|---:|---:|---:|---|")
    for quick in (False, True):
        for jobs in (1, 2):
            times, holding = [], ""
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as out:
                    t = time.perf_counter()
                    findings = reproduce(out, quick=quick, jobs=jobs, progress=False)
                    times.append(time.perf_counter() - t)
                holding = f"{sum(f.holds is True for f in findings)} of {len(findings)}"
            print(f"| {'quick' if quick else 'full'} | {jobs} | {statistics.median(times):.1f} | {min(times):.1f} "
                  f"| {holding} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
