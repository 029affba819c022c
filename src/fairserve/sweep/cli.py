"""`fairserve sweep`: a grid of simulations (policies × workloads or traces × KV pools × weights × seeds), run in
parallel locally or on a Ray cluster, resumable, aggregated over seeds into tables and figures (docs/sweeps.md).

`add_parser(subparsers)` registers the subcommand; `run(args)` runs it. Bad input raises ValueError with a one-line
message (the main CLI prints it as `fairserve: error: ...`, exit status 2); failed runs exit 1; an interrupted sweep
exits 130 with what finished stored.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ..argtypes import positive
from ..cli import add_fleet_flags
from ..core import describe
from ..sim.requests import MODES
from ..workloads import ALL_WORKLOADS, TRACE_FORMATS
from .spec import from_mapping, load_toml

DEFAULT_OUT = "fairserve-sweep"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sweep",
        help="run a grid of simulations in parallel (locally or on Ray); tables and figures over seeds",
        description="Run every combination of policies, workloads or traces, KV pool sizes, weights and seeds on "
        "the simulated engine, in parallel (--jobs N, or --ray ADDRESS for a Ray cluster). Finished runs are kept in "
        "OUT/runs and not run again. Writes table.csv and table.md (mean and 95% confidence interval over seeds), "
        "runs.csv, one figure per swept parameter and metric, and sweep.json. Flags override the sweep file's keys.",
    )
    p.add_argument("config", nargs="?", metavar="SWEEP.toml", help="a sweep file (see docs/sweeps.md)")
    p.add_argument(
        "--policy",
        metavar="P[,P...]",
        help=f"policies: {describe(prefix_cache=True)} (lpm and dlpm with --prefix-cache); each may end in engine "
        "options :preempt=DELTA, :preempt-max=K, :running-cap=TOKENS (docs/preemption.md)",
    )
    p.add_argument("--workload", metavar="NAME[,NAME...]", help=f"named workloads: {', '.join(ALL_WORKLOADS)}")
    p.add_argument("--trace", action="append", metavar="FILE", help="a request trace (repeat for several)")
    p.add_argument("--trace-format", choices=TRACE_FORMATS, help="the traces' format (default: auto)")
    p.add_argument("--kv-tokens", metavar="N[,N...]", help="KV pool sizes in tokens ('default': the workload's)")
    p.add_argument(
        "--weights",
        action="append",
        metavar="NODE=W,...",
        help="one weighting of tenants or groups per flag (repeat to sweep; 'default': the workload's)",
    )
    p.add_argument("--seeds", metavar="N|A-B|S,S,...", help="N seeds (0 to N-1), a range A-B, or a list (default: 1)")
    p.add_argument("--duration", type=positive(float, "a number"), metavar="S", help="named workloads' length in s")
    p.add_argument("--cost", choices=["linear", "profiled"], help="service cost function (default: linear)")
    p.add_argument("--w-p", type=float, help="weight of a prompt token (linear cost; default 1)")
    p.add_argument("--w-q", type=float, help="weight of an output token (linear cost; default 2)")
    p.add_argument("--engine-mode", choices=MODES, help="admission: reserve (default), paged or vllm (vLLM's steps)")
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        default=None,
        help="paged engine: share the KV blocks of common prompt prefixes (needed by lpm and dlpm)",
    )
    p.add_argument(
        "--block-tokens",
        type=positive(int, "a whole number"),
        metavar="N",
        help="tokens per KV block of the prefix cache (default: 16)",
    )
    p.add_argument(
        "--w-cached",
        type=float,
        metavar="W",
        help="weight of a prompt token served from the prefix cache (linear cost; default: --w-p)",
    )
    p.add_argument("--profile", metavar="NAME|FILE", help="latency model or profile file (default: the workload's)")
    add_fleet_flags(p)
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--jobs",
        type=positive(int, "a whole number"),
        default=len(os.sched_getaffinity(0)),
        metavar="N",
        help="local worker processes (default: the CPUs, %(default)s)",
    )
    where.add_argument(
        "--ray", metavar="ADDRESS", help="run each simulation as a task on the Ray cluster at ADDRESS (or 'auto')"
    )
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help="output folder (default: %(default)s)")
    p.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def values_from(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep file's keys, with each given flag in place of its key."""
    values = load_toml(args.config) if args.config else {}
    flags = {
        "policies": args.policy,
        "workloads": args.workload,
        "traces": [(t, t) for t in args.trace] if args.trace else None,
        "trace_format": args.trace_format,
        "kv_tokens": args.kv_tokens,
        "weights": args.weights,
        "seeds": args.seeds,
        "duration": args.duration,
        "cost": args.cost,
        "w_p": args.w_p,
        "w_q": args.w_q,
        "engine_mode": args.engine_mode,
        "profile": args.profile,
        "prefix_cache": args.prefix_cache,
        "block_tokens": args.block_tokens,
        "w_cached": args.w_cached,
        "engines": args.engines,
        "dispatch": args.dispatch,
        "autoscale": args.autoscale,
        "scale_wait_s": args.scale_wait,
        "scale_delay_s": args.scale_delay,
        "scale_idle_s": args.scale_idle,
    }
    return values | {k: v for k, v in flags.items() if v is not None}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from .run import Interrupted, RunsFailed, run_sweep  # NOTE: imports matplotlib; the parser does not need it
    from .runner import make_runner

    config = from_mapping(values_from(args))
    previous = signal.signal(signal.SIGTERM, _interrupt)  # NOTE: a stopped sweep stores what finished, as Ctrl-C
    try:
        result = run_sweep(
            config,
            args.out,
            lambda: make_runner(args.jobs, args.ray),
            progress=not args.no_progress,
            figures=not args.no_figures,
        )
    except Interrupted as e:
        print(f"fairserve: sweep {e}; the same command resumes it", file=sys.stderr)
        return 130
    except RunsFailed as e:
        print(f"fairserve: error: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = Path(args.out)
    print(f"ran {result.ran:,} runs ({result.stored:,} were stored) in {result.wall_s:.1f} s")
    print(f"table: {out / 'table.md'} (also table.csv, runs.csv, {len(result.files) - 3} figures, sweep.json)")
    return 0
