"""Admission decision cost vs the number of backlogged clients, per policy.

Setup (untimed): n clients, each with a charged history request, then 2 queued requests of random prompt sizes.
Timed per admission, through the ledger: pop() + a few output() + settle() + add() of a new request for that client
(it stays backlogged; counters keep moving). Policies run interleaved chunk by chunk; the median chunk is reported.
At the largest n, checks by brute force on sampled pops that VTC admits a client with the minimum backlogged counter.

Run: .venv/bin/python benchmarks/admission.py [--quick] [--sizes 10,1000] [--policies vtc,vtc@tree,fcfs] [--repeats 7]
(`vtc@tree`: VTC over the same tenants as the leaves of a three-level tree: 10 tiers × 100 organisations × n/1000.)
"""

from __future__ import annotations

import argparse
import gc
import math
import time

import numpy as np

from fairserve.core import Ledger, Request, check_policy, make_policy

TREE = "@tree"  # a policy spec with this suffix runs over a three-level tenant tree
POLICIES = ("fcfs", "vtc", "vtc@tree", "lcf", "drr", "rpm:1000000", "vtc-predict:oracle")
SIZES = (10, 100, 1_000, 10_000, 100_000)
OUTPUT_CALLS = 3  # output() calls per admission
TARGET_US, TARGET_N = 5.0, 10_000
MIN_CYCLES = 5  # fewest admissions per chunk, for a slow policy


class Bench:
    """One policy with n backlogged clients, and a pool of pre-built requests (construction is not timed)."""

    def __init__(self, spec: str, n: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        policy, _, tree = spec.partition(TREE)
        self.ledger = Ledger(make_policy(policy))
        self.now, self.next_id = 0.0, 0
        # NOTE: `vtc@tree`: the same n tenants as leaves of a three-level tree, 10 tiers x 100 organisations
        clients = [f"t{i % 10}/o{i // 10 % 100}/u{i}" if tree == "" and TREE in spec else f"c{i}" for i in range(n)]
        for c in clients:  # charge history, one client at a time (O(1) per pop for every policy): counters differ
            self._add(self._request(c))
            self._serve(self.ledger.pop(), int(self.rng.integers(1, 400)))
        for c in clients * 2:
            self._add(self._request(c))

    def _request(self, client: str) -> Request:
        self.next_id += 1
        return Request(
            id=self.next_id,
            tenant=client,
            prompt_tokens=int(self.rng.integers(16, 512)),
            max_tokens=int(self.rng.integers(OUTPUT_CALLS, 8 * OUTPUT_CALLS)),
            arrival_s=self.now,
        )

    def _add(self, req: Request, client: str | None = None) -> None:
        self.now += 1e-6
        req.tenant, req.arrival_s = client or req.tenant, self.now
        self.ledger.add(req, self.now)

    def _serve(self, req: Request, tokens: int) -> None:
        self.ledger.output(req, tokens)
        self.ledger.settle(req)

    def run(self, cycles: int) -> float:
        """Seconds per admission over `cycles` steady-state admissions."""
        pool = [self._request("") for _ in range(cycles)]
        per_call = [max(1, r.max_tokens // OUTPUT_CALLS) for r in pool]
        led, now = self.ledger, self.now
        pop, output, settle, add = led.pop, led.output, led.settle, led.add
        t0 = time.perf_counter()
        for new, k in zip(pool, per_call, strict=False):
            req = pop()
            for _ in range(OUTPUT_CALLS):
                output(req, k)
            settle(req)
            now += 1e-6
            new.tenant, new.arrival_s = req.tenant, now
            add(new, now)
        dt, self.now = time.perf_counter() - t0, now
        return dt / cycles

    def vtc_min_check(self, pops: int) -> bool:
        led, ok = self.ledger, True
        for new in [self._request("") for _ in range(pops)]:
            counters = led.counters
            low = min(counters[c] for c in led.backlogged())
            req = led.pop()
            ok &= counters[req.tenant] == low
            self._serve(req, 5)
            self._add(new, req.tenant)
        return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes, repeats and cycles (< 20 s)")
    ap.add_argument("--sizes", help="comma-separated client counts (default 10,100,1000,10000,100000)")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policy specs")
    ap.add_argument("--repeats", type=int, help="timed chunks per (policy, n); the median is reported")
    ap.add_argument("--cycles", type=int, help="admissions per timed chunk")
    a = ap.parse_args(argv)
    try:
        sizes = sorted({int(s) for s in a.sizes.split(",")} if a.sizes else (10, 100, 10_000) if a.quick else SIZES)
    except ValueError:
        ap.error(f"--sizes must be comma-separated integers, got {a.sizes!r}")
    policies = list(dict.fromkeys(p.strip() for p in a.policies.split(",") if p.strip())) or ap.error("no --policies")
    for p in policies:
        try:
            check_policy(p.removesuffix(TREE))
        except ValueError as e:
            ap.error(str(e))
    repeats = a.repeats if a.repeats is not None else (3 if a.quick else 7)
    cycles = a.cycles if a.cycles is not None else (3_000 if a.quick else 20_000)
    if min(sizes) < 2 or repeats < 1 or cycles < 1:
        ap.error("client counts must be >= 2, --repeats and --cycles >= 1")

    correct: bool | None = None
    gc.disable()  # as timeit does; requests hold no reference cycles, so refcounting frees them (and no 1 s pauses)
    chunk_s = 0.1 if a.quick else 0.4  # a chunk is capped near chunk_s (DRR is O(n))
    benches = {(p, n): Bench(p, n, seed=0) for n in sizes for p in policies}  # all at once: interleaved timing
    count = {k: int(min(cycles, max(MIN_CYCLES, chunk_s / b.run(10)))) for k, b in benches.items()}
    for k, b in benches.items():
        b.run(max(1, count[k] // 4))  # warm-up
    times: dict[tuple[str, int], list[float]] = {k: [] for k in benches}
    for _ in range(repeats):
        for k, b in benches.items():
            times[k].append(b.run(count[k]))
    us = {k: float(np.median(t)) * 1e6 for k, t in times.items()}
    best = {k: min(t) * 1e6 for k, t in times.items()}  # the fastest chunk: the least disturbed by neighbours
    fewest = min(count.values())
    if "vtc" in policies:
        correct = benches["vtc", sizes[-1]].vtc_min_check(20 if a.quick else 50)

    base = sizes[0]
    print(
        f"Admission cost (pop + {OUTPUT_CALLS}×on_output + finish + add), median of {repeats} chunks of {cycles:,} "
        f"admissions (slow cases: down to {fewest:,}). growth vs log2(n) = (t(n)/t({base})) / (log2 n / log2 {base})"
        "; ≤ ~1 means no faster than log n. µs above fcfs (medians): the cost of the ordering decision itself.\n"
    )
    floor = "fcfs" in policies  # FCFS's O(1) queue: the same cycle without an ordering decision
    print(
        f"| policy | clients n | µs / admission | µs (fastest chunk) | ratio to n={base} | growth vs log2(n) |"
        + (" µs above fcfs |" if floor else "")
        + "\n|---|---:|---:|---:|---:|---:|"
        + ("---:|" if floor else "")
    )
    for p in policies:
        for n in sizes:
            ratio = us[p, n] / us[p, base]
            growth = ratio / (math.log2(n) / math.log2(base))  # base >= 2, so log2(base) > 0
            print(
                f"| {p} | {n:,} | {us[p, n]:.2f} | {best[p, n]:.2f} | {ratio:.2f} | {growth:.2f} |"
                + (f" {us[p, n] - us['fcfs', n]:+.2f} |" if floor else "")
            )
    if "vtc" in policies and "vtc" + TREE in policies:
        n = TARGET_N if TARGET_N in sizes else sizes[-1]
        print(
            f"\nA three-level tree of {n:,} leaves vs flat VTC with {n:,} tenants: "
            f"{us['vtc' + TREE, n] / us['vtc', n]:.2f}× (goal ≤ 2×)"
        )
    if TARGET_N in sizes:
        print(
            "\n"
            + "\n".join(
                f"- {p}: {us[p, TARGET_N]:.2f} µs at {TARGET_N:,} clients (target ≤ {TARGET_US:g}"
                f" µs): {'met' if us[p, TARGET_N] <= TARGET_US else 'NOT met'}"
                for p in policies
            )
        )
    if correct is not None:
        print(
            f"\nVTC pops a minimum backlogged counter at {sizes[-1]:,} clients (brute force, sampled): "
            f"correct: {'yes' if correct else 'no'}"
        )
    return 0 if correct is not False else 1


if __name__ == "__main__":
    raise SystemExit(main())
