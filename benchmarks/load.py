"""Load: 10,000 streamed requests (64 at a time, 4 tenants) through `fairserve gateway` to a `fairserve emulate` that
fails 3% of requests at once and cuts 3% mid-stream. Checks that nothing is lost (every request ends in exactly one
outcome, at the client and in the gateway's metrics, as tests/test_load.py does with 600) and reports the rate.
Run: .venv/bin/python benchmarks/load.py [--requests 10000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.load import check_nothing_lost, run_load  # noqa: E402  (the in-suite load test, at full size)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--quick", action="store_true", help="1,000 requests")
    args = p.parse_args()
    requests = 1_000 if args.quick else args.requests
    start = time.monotonic()
    counts, recorded, retries = run_load(requests)
    wall = time.monotonic() - start
    try:
        check_nothing_lost(requests, counts, recorded, retries)
        verdict = "nothing lost"
    except AssertionError as e:
        verdict = f"LOST: {e}"
    print("| requests | wall s (incl. start) | requests/s | at the client | in the gateway | retried | verdict |")
    print("|---|---|---|---|---|---|---|")
    client = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    gateway = ", ".join(f"{k} {v:.0f}" for k, v in sorted(recorded.items()) if v)
    print(f"| {requests:,} | {wall:.1f} | {requests / wall:.0f} | {client} | {gateway} | {retries} | {verdict} |")
    return 0 if verdict == "nothing lost" else 1


if __name__ == "__main__":
    sys.exit(main())
