"""Run the selected experiments' simulations (deduplicated, optionally in processes), judge, draw, report."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from ..sweep.runner import LocalRunner, Runner
from . import plots, report
from .experiments import ALL_EXPERIMENTS, Experiment, Results
from .runs import REAL, RunSpec, run, trace_available

BY_NAME = {e.name: e for e in ALL_EXPERIMENTS}


def select(only: list[str] | None) -> list[Experiment]:
    if not only:
        return list(ALL_EXPERIMENTS)
    unknown = [n for n in only if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown experiment(s) {', '.join(unknown)}; choose from: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in only]


def _simulate(args: tuple[RunSpec, bool, str | None]):
    return run(*args)


def _draw(args: tuple[str, Results, Path]) -> list[tuple[str, str]]:
    name, res, out_dir = args
    return plots.draw(BY_NAME[name], res, out_dir)


def _map(runner: Runner, fn: Callable, items: list, desc: str, progress: bool) -> list:
    it = runner.imap(fn, items)
    return list(tqdm(it, total=len(items), desc=desc, unit="", disable=not progress, leave=False))


def reproduce(
    out_dir: str | Path = "fairserve-results",
    only: list[str] | None = None,
    quick: bool = False,
    jobs: int = 1,
    trace: str | None = None,
    progress: bool = True,
) -> list[report.Finding]:
    """Run the experiments and write their figures, report.md and report.html into `out_dir`."""
    start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    experiments = select(only)
    have_real = trace_available(trace)
    specs = list(dict.fromkeys(r for e in experiments for r in e.runs if have_real or r.workload != REAL))
    with LocalRunner(jobs) as runner:  # the runner of `fairserve sweep`: this process, or worker processes
        outs = _map(runner, _simulate, [(s, quick, trace) for s in specs], "simulating", progress)
        res = Results({(s.workload, s.name): o for s, o in zip(specs, outs, strict=False)})
        ran = [e for e in experiments if e.runs and all((r.workload, r.name) in res for r in e.runs)]
        subsets = [
            (e.name, Results({k: v for k, v in res.items() if k in {(r.workload, r.name) for r in e.runs}}), out_dir)
            for e in ran
        ]
        drawn = dict(zip((e.name for e in ran), _map(runner, _draw, subsets, "drawing", progress), strict=False))
    findings = []
    for exp in experiments:
        if exp.runs and exp.name not in drawn:
            findings.append(
                report.Finding(
                    exp,
                    None,
                    "skipped: the Chatbot Arena trace was not found (set FAIRSERVE_ARENA_TRACE or pass --trace FILE)",
                )
            )
            continue
        holds, evidence, ours = report.judge(exp, res)
        runs = [res[r.workload, r.name] for r in exp.runs]
        findings.append(report.Finding(exp, holds, evidence, drawn.get(exp.name, []), runs, ours))
    meta = {
        "engine": "Llama-2-7b on an A10G (latency profiled by the paper), KV pool 10,000 tokens, S-LoRA's "
        "conservative admission; ablation: Llama-2-13b on an A100-80GB (roofline), pools 35,000/65,000",
        "mode": "quick (shortened workloads)" if quick else "full",
        "runs": len(specs),
        "wall_s": time.perf_counter() - start,
    }
    report.write(findings, out_dir, meta)
    return findings
