"""`fairserve` command line. Bad input gets one `fairserve: error: ...` line and exit status 2."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .argtypes import positive

if TYPE_CHECKING:
    from .metrics import Summary
    from .sim import SimOptions, SimResult

# NOTE: the simulator, the metrics and the workloads (numpy with them) are imported by the command that runs them,
# so that `fairserve --version` and `--help` answer at once


class CliError(Exception):
    pass


# subcommands that live in their own package: each has cli.add_parser(subparsers) and cli.run(args) -> int
SERVICES = ("emulate", "gateway", "serve", "bench", "sweep", "profile")
# every subcommand's one line in `fairserve --help` (each parser says the same: tests/test_cli_startup.py)
SUMMARIES = {
    "simulate": "run a workload on the simulated continuous-batching engine",
    "reproduce": "run the paper's evaluation and write figures and a report",
    "emulate": "serve an OpenAI-compatible API backed by the simulated engine, in real time",
    "gateway": "serve a fair OpenAI-compatible gateway in front of OpenAI-compatible servers",
    "serve": "serve an OpenAI-compatible API from a real engine scheduled by VTC",
    "bench": "replay a workload against an OpenAI-compatible endpoint and measure fairness",
    "sweep": "run a grid of simulations in parallel (locally or on Ray); tables and figures over seeds",
    "top": "per-tenant rates, counters and queues of a gateway or serve, live in the terminal",
    "profile": "measure an engine's step times and write a profile file for --profile",
}


class _Version(argparse.Action):
    """--version, with the installed version read only when asked (importlib.metadata costs ~0.1 s)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from . import __version__

        print(f"fairserve {__version__}")
        parser.exit()


def build_parser(command: str | None = None, *, outline: bool = False) -> argparse.ArgumentParser:
    """The whole command line; with `command` naming a subcommand, the other subcommands are outlines (their name
    and one line, for `--help` and the usage line), not parsers: importing what builds them (the simulator's
    policies and workloads, web frameworks and HTTP clients) is most of a command's start-up. `outline` makes every
    subcommand an outline (`fairserve --help`, `--version`, an unknown command)."""
    p = argparse.ArgumentParser(
        prog="fairserve",
        description="Fair sharing of an LLM server among many clients.",
        epilog="Exit status: 0 done; 1 failed while running; 2 refused to start (bad flags, config or files, a port "
        "in use, an unreachable target or Redis); 130 interrupted. See the README.",
    )
    p.add_argument("--version", action=_Version, help="show the version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    full = [] if outline else list(SUMMARIES) if command not in SUMMARIES else [command]
    for name in SUMMARIES:
        if name not in full:
            sub.add_parser(name, help=SUMMARIES[name], add_help=False)
        elif name == "simulate":
            _simulate_parser(sub)
        elif name == "reproduce":
            _reproduce_parser(sub)
        elif name == "top":
            importlib.import_module("fairserve.top").add_parser(sub)
        else:
            importlib.import_module(f"fairserve.{name}.cli").add_parser(sub)
    return p


def _simulate_parser(sub: argparse._SubParsersAction) -> None:
    from .core import describe
    from .sim import LATENCY_MODELS, MODES
    from .workloads import ALL_WORKLOADS, TRACE_FORMATS

    s = sub.add_parser(
        "simulate",
        help=SUMMARIES["simulate"],
        description="Run a workload on the simulated engine and print per-client service, response times and fairness.",
    )
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="NAME", help=f"one of: {', '.join(ALL_WORKLOADS)}")
    src.add_argument("--trace", metavar="FILE", help="a request trace (CSV/JSONL; see docs/workloads.md)")
    s.add_argument("--trace-format", default="auto", choices=TRACE_FORMATS)
    s.add_argument(
        "--policy",
        default="vtc",
        metavar="P[,P...]",
        help=f"policies to compare: {describe(prefix_cache=True)}; each may end in engine options :preempt=DELTA, "
        ":preempt-max=K, :running-cap=TOKENS (docs/preemption.md)",
    )
    s.add_argument(
        "--weights",
        metavar="NODE=W,...",
        help="weights of tenants or groups (paths: org/team/user), e.g. client-0=1,client-1=2 or acme=2,acme/bob=3",
    )
    s.add_argument(
        "--priorities",
        metavar="NODE=P,...",
        help="priorities of tenants or groups (lower is served first, strictly), e.g. premium=0,free=1",
    )
    s.add_argument(
        "--cost",
        default="linear",
        choices=["linear", "profiled"],
        help="service cost function (profiled: the paper's A10G/Llama-2-7b h(x, y))",
    )
    s.add_argument("--w-p", type=float, default=1.0, help="weight of a prompt token (linear cost)")
    s.add_argument("--w-q", type=float, default=2.0, help="weight of an output token (linear cost)")
    s.add_argument(
        "--w-cached",
        type=float,
        metavar="W",
        help="weight of a prompt token served from the prefix cache (linear cost; default: --w-p), for every policy",
    )
    s.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help=f"latency model: {', '.join(LATENCY_MODELS)}; or a profile file of a measured engine (fairserve profile)",
    )
    s.add_argument("--kv-tokens", type=positive(int, "a whole number"), metavar="N", help="KV-cache pool in tokens")
    s.add_argument(
        "--engine-mode",
        default="reserve",
        choices=MODES,
        help="reserve: the paper's admission; paged: vLLM-like, preempting; vllm: vLLM's own steps (docs/latency.md)",
    )
    s.add_argument(
        "--prefix-cache",
        action="store_true",
        help="paged engine: share the KV blocks of common prompt prefixes (needed by lpm and dlpm)",
    )
    s.add_argument(
        "--block-tokens",
        type=positive(int, "a whole number"),
        default=16,
        metavar="N",
        help="tokens per KV block of the prefix cache (default: %(default)s)",
    )
    s.add_argument(
        "--duration", type=positive(float, "a number"), metavar="S", help="shorten a named workload to S seconds"
    )
    s.add_argument("--drain", action="store_true", help="run until every request is done, not to the duration")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", metavar="OUT", help="write the summary and every request record as JSON")
    add_fleet_flags(s)


def add_fleet_flags(p: argparse.ArgumentParser) -> None:
    """The fleet's flags (docs/fleet.md), which `simulate` and `sweep` share."""
    f = p.add_argument_group("a fleet of engines behind the gateway's dispatch (docs/fleet.md)")
    f.add_argument(
        "--engines", type=positive(int, "a whole number"), metavar="N", help="N engines behind one dispatcher"
    )
    f.add_argument(
        "--dispatch",
        metavar="RULE",
        help="least_loaded (default: any engine, the least-loaded with room) or shard:K (each tenant a hand of K)",
    )
    f.add_argument("--autoscale", metavar="MIN:MAX", help="scale the fleet between MIN and MAX engines")
    f.add_argument(
        "--scale-wait",
        type=positive(float, "a number"),
        metavar="S",
        help="ask for an engine when the oldest queued request has waited S seconds (default: 10)",
    )
    f.add_argument(
        "--scale-delay",
        type=positive(float, "a number", zero=True),
        metavar="S",
        help="a new engine's start-up (default: 60)",
    )
    f.add_argument(
        "--scale-idle",
        type=positive(float, "a number", zero=True),
        metavar="S",
        help="let an engine go after S seconds idle (default: 60)",
    )


def _reproduce_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "reproduce",
        help=SUMMARIES["reproduce"],
        description="Reproduce the experiments of 'Fairness in Serving Large Language Models' on the "
        "simulated engine: one PNG per figure, report.md and report.html.",
    )
    r.add_argument("--out", default="fairserve-results", metavar="DIR", help="output folder (default: %(default)s)")
    r.add_argument("--only", metavar="NAMES", help="comma-separated experiments (default: all)")
    r.add_argument("--quick", action="store_true", help="shorter workloads")
    r.add_argument(
        "--jobs",
        type=positive(int, "a whole number"),
        default=2,
        metavar="N",
        help="worker processes (default: %(default)s)",
    )
    r.add_argument("--trace", metavar="FILE", help="a trace to use as the `real` workload")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")


def unknown_options(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The `--options` in `argv` that neither the command nor its subcommand defines (nor abbreviates), so that
    they are named before argparse complains about a missing required argument."""
    subs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)  # noqa: SLF001
    chosen = next((t for t in argv if not t.startswith("-")), None)
    target = subs.choices.get(chosen, parser) if subs is not None and chosen is not None else parser
    known = [s for a in target._actions for s in a.option_strings]  # noqa: SLF001
    flags = [t.split("=", 1)[0] for t in argv if t.startswith("--") and t != "--"]
    return [f for f in flags if not any(k.startswith(f) for k in known)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((t for t in argv if not t.startswith("-")), None)
    parser = build_parser(command, outline=command not in SUMMARIES)
    if unknown := unknown_options(parser, argv):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args = parser.parse_args(argv)
    from .workloads import WorkloadError  # NOTE: here, not at the top: `--help` and `--version` have exited

    try:
        if args.command in SERVICES:
            return importlib.import_module(f"fairserve.{args.command}.cli").run(args)
        if args.command == "top":
            return importlib.import_module("fairserve.top").run(args)
        return _reproduce(args) if args.command == "reproduce" else _simulate(args)
    except (CliError, WorkloadError, ValueError, OSError) as e:
        print(f"fairserve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # NOTE: servers stop on Ctrl-C themselves (after their drain) and return 0
        print("fairserve: interrupted", file=sys.stderr)
        return 130


def _simulate(args: argparse.Namespace) -> int:
    from .core import check_nodes, make_cost, parse_priorities, parse_weights
    from .metrics import jain_window, summarize
    from .metrics.difference import print_work_limit
    from .sim import simulate
    from .workloads import get_workload, load_trace

    if args.trace:
        if not Path(args.trace).is_file():
            raise CliError(f"trace file not found: {args.trace}")
        workload = load_trace(args.trace, args.trace_format, seed=args.seed)
    else:
        workload = get_workload(args.workload, seed=args.seed, duration_s=args.duration)
    if not workload.arrivals:
        raise CliError("the workload has no requests")
    tenants = {a.client for a in workload.arrivals}
    given = parse_weights(args.weights)
    priorities = parse_priorities(args.priorities)
    check_nodes(tenants, given or (), "--weights")
    check_nodes(tenants, priorities or (), "--priorities")
    weights = given or workload.weights
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if not policies:
        raise CliError("--policy needs at least one policy")
    runs = [options_from(args, spec) for spec in policies]  # NOTE: all checked before the first (slow) run
    for options in runs:
        spec = options.spec
        if priorities and spec is not None and not spec.entry.capabilities.tree:
            raise CliError(f"--priorities: policy {options.policy!r} does not order by priority; use vtc")
    cost = make_cost(args.cost, args.w_p, args.w_q, args.w_cached)
    print(
        f"workload {workload.name}: {len(workload.arrivals)} requests from "
        f"{len({a.client for a in workload.arrivals})} clients over {workload.duration_s:g} s"
    )
    for spec, options in zip(policies, runs, strict=True):
        result = simulate(workload, options, weights=weights, priorities=priorities)
        duration = result.end_s if args.drain else workload.duration_s
        work, window = print_work_limit(len(result.records)), jain_window(duration)
        summary = summarize(
            result.records, duration, args.w_p, args.w_q, weights, window_s=window, cost=cost, work_limit=work
        )
        print()
        print(format_summary(result, summary, window))
        if args.json:
            out = Path(args.json)
            if len(policies) > 1:
                out = out.with_name(f"{out.stem}.{spec.replace(':', '-')}{out.suffix or '.json'}")
            write_json(out, result, summary)
            print(f"wrote {out}")
    return 0


def options_from(args: argparse.Namespace, policy: str, **overrides: Any) -> SimOptions:
    """The run's `SimOptions` from the engine flags `simulate` and `sweep` share, checked (ValueError, one line)."""
    from .sim import SimOptions

    values = {
        "policy": policy,
        "latency": args.profile,
        "kv_tokens": args.kv_tokens,
        "mode": args.engine_mode,
        "prefix_cache": args.prefix_cache,
        "block_tokens": args.block_tokens,
        "cost": args.cost,
        "w_p": args.w_p,
        "w_q": args.w_q,
        "w_cached": args.w_cached,
        "seed": args.seed,
        "drain": args.drain,
        "engines": args.engines,
        "dispatch": args.dispatch or "least_loaded",
        "autoscale": args.autoscale,
    }
    scaling = {"scale_wait_s": args.scale_wait, "scale_delay_s": args.scale_delay, "scale_idle_s": args.scale_idle}
    values |= {k: v for k, v in scaling.items() if v is not None}
    return SimOptions(**(values | overrides)).check()


def _reproduce(args: argparse.Namespace) -> int:
    from .reproduce import reproduce  # NOTE: imports matplotlib; `simulate` does not need it

    if args.trace and not Path(args.trace).is_file():
        raise CliError(f"trace file not found: {args.trace}")
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    findings = reproduce(
        args.out, only=only, quick=args.quick, jobs=args.jobs, trace=args.trace, progress=not args.no_progress
    )
    width = max(len(f.experiment.name) for f in findings)
    for f in findings:
        print(f"{f.experiment.name:<{width}}  {f.verdict:<14}  {f.experiment.claim}")
    out = Path(args.out)
    print(
        f"\nreport: {out / 'report.html'} (also {out / 'report.md'}, and {sum(len(f.figures) for f in findings)} "
        f"figures in {out}/)"
    )
    return 0


def format_summary(result: SimResult, s: Summary, window_s: float = 60.0) -> str:
    from .metrics import summary_table
    from .sim import hit_rate, hit_rates

    cfg = result.config
    rules = ""
    if cfg.preempt_delta is not None:
        rules += f", preempt at a counter gap > {cfg.preempt_delta:g} ({result.fair_preemptions} preempted)"
    if cfg.running_cap is not None:
        rules += f", running cap {cfg.running_cap:,} tokens per tenant"
    title = (
        f"policy {result.ledger.policy.name}  (engine: {cfg.mode}, KV pool {cfg.kv_tokens:,} tokens{rules}, "
        f"simulated {s.duration_s:.0f} s)"
    )
    table = summary_table(s, title, window_s)
    if result.fleet is not None:
        table += "\n" + result.fleet.text()
    if result.cached_tokens is None:
        return table
    rates = hit_rates(result.records, result.cached_tokens)
    overall = hit_rate(result.records, result.cached_tokens)
    lines = [f"prefix cache ({cfg.block_tokens}-token blocks): {overall:.1%} of prompt tokens served from it"]
    clients = sorted({r.client for r in result.records})
    lines += [f"  {c:<20} {rates[c]:6.1%}" if c in rates else f"  {c:<20} (nothing admitted)" for c in clients]
    return table + "\n" + "\n".join(lines)


def write_json(path: Path, result: SimResult, summary: Summary) -> None:
    from .sim import hit_rate, hit_rates

    doc: dict[str, Any] = {
        "summary": {
            "policy": result.ledger.policy.name,
            "cost": result.ledger.cost.name,
            "engine_mode": result.config.mode,
            "kv_tokens": result.config.kv_tokens,
            "decode_steps": result.decode_steps,
            "preemptions": result.preemptions,
            **summary.to_dict(),
        },
        "requests": [r.to_dict() for r in result.records],
    }
    if result.fleet is not None:
        doc["summary"]["fleet"] = result.fleet.to_dict()
    if result.cached_tokens is not None:
        doc["summary"]["prefix_cache"] = {
            "block_tokens": result.config.block_tokens,
            "hit_rate": hit_rate(result.records, result.cached_tokens),
            "hit_rate_by_client": hit_rates(result.records, result.cached_tokens),
        }
    path.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    sys.exit(main())
