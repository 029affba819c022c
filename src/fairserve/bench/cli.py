"""`fairserve bench`: replay a workload against an OpenAI-compatible endpoint and report per-client fairness.

`add_parser(subparsers)` registers the subcommand; `run(args)` runs it and returns 0. Bad input raises ValueError
with a one-line message (the main CLI prints it as `fairserve: error: ...`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ..argtypes import positive
from ..core import parse_weights
from ..workloads import ALL_WORKLOADS, TRACE_FORMATS, Workload, get_workload, load_trace
from .report import bench_duration, bench_step, format_table, summarize_bench, write_json, write_plots
from .runner import (
    DEFAULT_MODEL,
    DEFAULT_TIMEOUT_S,
    ENDPOINTS,
    PLACEMENTS,
    XARGS_CLIENT_KEY,
    BenchRecord,
    place,
    preflight,
    resolve_keys,
    run_bench,
)
from .tree import Node, format_tree_scores, read_tree, tree_scores
from .weights import server_weights

TTFT_NOTE = (
    "Through the fairserve gateway a response's headers arrive with its first token: the gateway sends them "
    "only once the backend has streamed output, so that a backend failing before any output can still be "
    "retried elsewhere. Time to headers equals time to first token, by design."
)


def parse_keys(text: str) -> dict[str, str]:
    """`client=KEY,...`; `*=KEY` is the default for clients not listed."""
    out: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        client, sep, key = (x.strip() for x in part.partition("="))
        if not sep or not client or not key:
            raise ValueError(f"bad --keys entry {part.strip()!r}: expected CLIENT=KEY (or *=KEY for the rest)")
        if client in out:
            raise ValueError(f"--keys lists client {client!r} twice")
        out[client] = key
    if not out:
        raise ValueError("--keys needs at least one CLIENT=KEY entry")
    return out


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="replay a workload against an OpenAI-compatible endpoint and measure fairness",
        description="Send a workload's requests, on time, to an OpenAI-compatible streaming endpoint (the fairserve "
        "gateway or emulator, vLLM, ...) with one API key per client; print per-client service, response "
        "time and latency, fairness and throughput. Times are reported in workload seconds.",
        epilog=TTFT_NOTE,
    )
    p.add_argument(
        "--target",
        required=True,
        metavar="URL[,URL...]",
        help="base URL, e.g. http://127.0.0.1:8000 (or .../v1); several, comma-separated, for gateway "
        "replicas (see --placement)",
    )
    p.add_argument(
        "--placement",
        default="round-robin",
        choices=PLACEMENTS,
        help="with several targets: round-robin over requests, or by-client (each client pinned to one "
        "target, the adversarial case for fairness across replicas)",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="NAME", help=f"one of: {', '.join(ALL_WORKLOADS)}")
    src.add_argument("--trace", metavar="FILE", help="a request trace (CSV/JSONL; see docs/workloads.md)")
    p.add_argument("--trace-format", default="auto", choices=TRACE_FORMATS)
    p.add_argument(
        "--keys",
        required=True,
        metavar="c=KEY,...",
        help="API key per client; *=KEY is the default for clients not listed",
    )
    weights = p.add_mutually_exclusive_group()
    weights.add_argument(
        "--weights", metavar="c=w,...", help="client weights for the fairness metrics (default: the workload's)"
    )
    weights.add_argument(
        "--admin-key",
        metavar="KEY",
        help="score fairness with the weights the gateway (or fairserve serve) gives: read from its "
        "admin API, each client weighted as the tenant that owns its --keys key; with groups configured, "
        "also each tenant's and group's share against the tenant tree",
    )
    p.add_argument(
        "--time-scale",
        type=positive(float, "a number"),
        default=1.0,
        metavar="X",
        help="replay X times faster than the workload (default: 1)",
    )
    p.add_argument(
        "--duration", type=positive(float, "a number"), metavar="S", help="keep only the first S workload seconds"
    )
    p.add_argument("--endpoint", default="completions", choices=ENDPOINTS)
    p.add_argument(
        "--model", help=f"model name to send (default: the first the target lists at /v1/models, else {DEFAULT_MODEL})"
    )
    p.add_argument(
        "--timeout",
        type=positive(float, "a number"),
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="give up on a request after S wall seconds (default: %(default)g)",
    )
    p.add_argument(
        "--max-inflight",
        type=positive(int, "a whole number"),
        metavar="N",
        help="at most N requests open at once (later ones wait in the client)",
    )
    p.add_argument(
        "--client-xargs",
        nargs="?",
        const=XARGS_CLIENT_KEY,
        metavar="KEY",
        help='also name the client in each request body as "vllm_xargs": {KEY: CLIENT} (KEY defaults '
        f"to {XARGS_CLIENT_KEY}), for vLLM with fairserve's scheduler, which sees no API keys",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for the target to answer before the run (a server just started); default 0",
    )
    p.add_argument("--json", metavar="OUT", help="write the summary and every request record as JSON")
    p.add_argument("--plots", metavar="DIR", help="write service_rate.png and response_time.png to DIR")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def load_workload(args: argparse.Namespace) -> Workload:
    if args.trace:
        if not Path(args.trace).is_file():
            raise ValueError(f"trace file not found: {args.trace}")
        w = load_trace(args.trace, args.trace_format, seed=args.seed)
        if args.duration is not None:
            w = Workload(
                name=w.name,
                arrivals=[a for a in w.arrivals if a.arrival_s < args.duration],
                duration_s=args.duration,
                weights=w.weights,
            )
    else:
        w = get_workload(args.workload, seed=args.seed, duration_s=args.duration)
    if not w.arrivals:
        raise ValueError(f"the workload {w.name!r} has no requests")
    return w


def target_label(target: str) -> str:
    """The plots' label for `--target`: each target's host:port (several targets: comma-separated)."""
    return ", ".join(urlsplit(t.strip()).netloc or t.strip() for t in target.split(",") if t.strip())


def run(args: argparse.Namespace) -> int:
    workload = load_workload(args)
    urls = place(args.target, workload.arrivals, args.endpoint, args.placement)
    url = ", ".join(dict.fromkeys(urls))
    clients = sorted({a.client for a in workload.arrivals})
    keys = parse_keys(args.keys)
    key_of = resolve_keys(keys, clients)
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise ValueError(f"--json: folder not found: {Path(args.json).parent}")
    pinned = (
        dict(zip((a.client for a in workload.arrivals), urls, strict=True)) if args.placement == "by-client" else {}
    )
    listed = preflight(urls, key_of, pinned, max(0.0, args.wait))
    # NOTE: after the wait: a gateway just started answers its admin API only once it is up
    admin_key = args.admin_key
    tree: dict[str, Node] = {}
    tenant_of: dict[str, str] = {}
    if admin_key:
        found = server_weights(args.target, admin_key, key_of)
        weights, tenant_of = found.weights, found.tenant_of
        print(f"weights from {args.target}'s admin API: {found.describe()}", flush=True)
        tree = read_tree(args.target, admin_key)
    else:
        weights = parse_weights(args.weights) or workload.weights or {}
    model = args.model or (listed[0] if listed else DEFAULT_MODEL)
    print(
        f"bench {workload.name}: {len(workload.arrivals)} requests from {len(clients)} clients over "
        f"{workload.duration_s:g} s (sent over about {workload.duration_s / args.time_scale:g} s of wall time, then "
        f"up to {args.timeout:g} s more for the last answers) -> {url}",
        flush=True,
    )
    with _Bar(len(workload.arrivals), args.no_progress) as bar:
        records = run_bench(
            args.target,
            workload.arrivals,
            keys,
            time_scale=args.time_scale,
            endpoint=args.endpoint,
            model=model,
            timeout_s=args.timeout,
            max_inflight=args.max_inflight,
            xargs_key=args.client_xargs,
            progress=bar.record,
            placement=args.placement,
        )
    duration = bench_duration(records, workload.duration_s)
    summary = summarize_bench(records, duration, weights)
    title = f"target {args.target}  ({args.endpoint}, time scale {args.time_scale:g}, {duration:.0f} workload s)"
    print()
    print(format_table(summary, records, title))
    scores = []
    if any(not n.leaf for n in tree.values()):  # NOTE: a flat list of tenants is scored by the weights above
        scores = tree_scores(records, duration, tenant_of, tree, bench_step(duration))
        print(format_tree_scores(scores))
    if args.json:
        meta = {
            "target": args.target,
            "endpoint": args.endpoint,
            "model": model,
            "workload": workload.name,
            "time_scale": args.time_scale,
            "weights": weights,
            **({"tree_shares": [sc.row() for sc in scores]} if scores else {}),
        }
        print(f"wrote {write_json(args.json, summary, records, meta)}")
    if args.plots:
        label = target_label(args.target)
        paths = write_plots(args.plots, records, duration, label, f"bench {workload.name}")
        print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


class _Bar:
    """A progress bar on stderr: requests ended of all, and how many of them failed."""

    def __init__(self, total: int, off: bool) -> None:
        from tqdm import tqdm

        self.failed = 0
        self.bar = tqdm(
            total=total, unit="req", desc="requests", file=sys.stderr, disable=off, mininterval=1.0, dynamic_ncols=True
        )

    def record(self, r: BenchRecord) -> None:
        if r.status != "finished":
            self.failed += 1
            self.bar.set_postfix_str(f"{self.failed} not finished", refresh=False)
        self.bar.update(1)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *_: object) -> None:
        self.bar.close()
