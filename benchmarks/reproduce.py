"""Wall time of `fairserve reproduce`, full and --quick, with 1 and 2 worker processes (median of repeats).

Targets: the whole default suite in < 60 s on a 2-core machine, --quick in < 10 s.
Run: .venv/bin/python benchmarks/reproduce.py [--repeats 3] [--jobs 1,2] [--modes full,quick]

`--readme docs/results.md` instead runs the full suite once (2 processes) and replaces the verdict table in that file
(between `<!-- reproduce:begin -->` and `<!-- reproduce:end -->`) with the report's overview.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fairserve.reproduce import reproduce
from fairserve.reproduce.report import readme_table

BEGIN, END = "<!-- reproduce:begin -->", "<!-- reproduce:end -->"


def update_readme(path: Path) -> int:
    text = path.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        print(f"benchmarks/reproduce.py: {path} needs one {BEGIN} ... {END} block", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as out:
        findings = reproduce(out, jobs=2, progress=False)
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    path.write_text(f"{head}{BEGIN}\n{readme_table(findings)}{END}{tail}")
    print(f"{path}: table regenerated ({sum(f.holds is True for f in findings)} of {len(findings)} hold or answer yes)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", default="1,2", help="comma-separated worker counts (default 1,2)")
    p.add_argument("--modes", default="full,quick", help="comma-separated: full, quick (default both)")
    p.add_argument(
        "--readme", type=Path, help="regenerate this file's verdict table (docs/results.md) instead of timing"
    )
    args = p.parse_args()
    if args.readme:
        return update_readme(args.readme)
    try:
        jobs_list = [int(j) for j in args.jobs.split(",")]
    except ValueError:
        jobs_list = []
    modes = args.modes.split(",")
    if args.repeats < 1 or not jobs_list or min(jobs_list) < 1 or not set(modes) <= {"full", "quick"}:
        print("benchmarks/reproduce.py: --repeats and --jobs must be >= 1, --modes full and/or quick", file=sys.stderr)
        return 2
    print("| mode | jobs | wall s (median) | min | verdicts holding |")
    print("|---|---:|---:|---:|---|")
    for quick in [m == "quick" for m in modes]:
        for jobs in jobs_list:
            times, holding = [], ""
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as out:
                    t = time.perf_counter()
                    findings = reproduce(out, quick=quick, jobs=jobs, progress=False)
                    times.append(time.perf_counter() - t)
                holding = f"{sum(f.holds is True for f in findings)} of {len(findings)}"
            print(
                f"| {'quick' if quick else 'full'} | {jobs} | {statistics.median(times):.1f} | {min(times):.1f} "
                f"| {holding} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
