"""A sweep from start to end: the stored runs, the missing ones on a runner (each stored as it finishes), then the
tables, the figures and the manifest (`sweep.json`)."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .figures import draw_all
from .runner import Runner
from .spec import AXES, Point, Source, SweepConfig
from .store import Store, code_version, commit, file_sha256, run_key, write_atomic
from .table import Provenance, aggregate, write_csv, write_markdown, write_runs_csv
from .work import Task, execute, own_digest, workload_file


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) during the runs: what finished is stored."""

    def __init__(self, done: int, total: int, out_dir: Path):
        super().__init__(f"interrupted: {done:,} of {total:,} runs are stored in {out_dir}/runs")
        self.done, self.total = done, total


class RunsFailed(Exception):
    """Some runs raised; the others are stored."""


@dataclass
class SweepResult:
    out_dir: Path
    total: int
    stored: int  # found done before this sweep
    ran: int
    pruned: int  # stale results removed (another code version)
    files: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def label(p: Point) -> str:
    return ", ".join(f"{a} {v}" for a, v in zip(AXES, p.group, strict=True)) + f", seed {p.seed}"


def dimensions(config: SweepConfig) -> str:
    sizes = [
        (len(config.policies), "policy", "policies"),
        (len(config.sources), "workload", "workloads"),
        (len(config.kv_tokens), "pool", "pools"),
        (len(config.weights), "weighting", "weightings"),
        (len(config.seeds), "seed", "seeds"),
    ]
    return " × ".join(f"{n} {one if n == 1 else many}" for n, one, many in sizes)


def run_sweep(
    config: SweepConfig,
    out_dir: str | Path,
    make_runner: Callable[[], Runner],
    *,
    progress: bool = True,
    figures: bool = True,
    say: Callable[[str], None] = print,
) -> SweepResult:
    """Run what is missing of `config`'s grid in `out_dir` (the runner is made only if something is), then write
    table.csv, table.md, runs.csv, the figures and sweep.json there."""
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    version, digest = code_version(), own_digest()
    hashes = {s: _hash(s) for s in config.sources}
    points = config.points()
    keys = {p: run_key(p.spec(), hashes[p.source], version) for p in points}
    store = Store(out, version)
    pruned = store.prune()
    found = store.load()
    records = {p: found[keys[p]] for p in points if keys[p] in found}
    missing = [p for p in points if p not in records]
    say(f"sweep: {len(points):,} runs ({dimensions(config)}); {len(records):,} stored in {out}/runs")
    if pruned:
        say(f"removed {pruned:,} stale results (another fairserve version) from {out}/runs")
    executor, errors = None, {}
    if missing:
        with make_runner() as runner:
            executor = runner.description
            say(f"running {len(missing):,} on {executor}")
            errors = _run(missing, runner, store, records, keys, hashes, digest, progress, out, len(points))
    failed = [p for p in missing if p not in records]
    if failed:
        raise RunsFailed(
            f"{len(failed):,} of {len(missing):,} runs failed ({len(records):,} of {len(points):,} are stored; the "
            f"same command runs the failed ones again); the first: {label(failed[0])}: {errors.get(failed[0])}"
        )
    prov = Provenance(version, commit(), config.seeds, config.to_dict(), len(points))
    rows = aggregate(points, {p: records[p]["result"] for p in points})
    drawn = draw_all(rows, config.swept, out, prov) if figures else []
    write_csv(rows, out / "table.csv", prov)
    write_markdown(rows, out / "table.md", prov, drawn)
    write_runs_csv(points, records, out / "runs.csv", prov)
    files = ["table.csv", "table.md", "runs.csv", *drawn]
    result = SweepResult(out, len(points), len(points) - len(missing), len(missing), pruned, files)
    result.wall_s = time.perf_counter() - start
    manifest = {
        "fairserve": version,
        "commit": prov.commit,
        "seeds": list(config.seeds),
        "config": prov.config,
        "runs": len(points),
        "stored_before": result.stored,
        "ran": result.ran,
        "executor": executor,
        "wall_s": result.wall_s,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "files": files,
    }
    write_atomic(out / "sweep.json", json.dumps(manifest, indent=1) + "\n")
    return result


def _run(
    missing: list[Point],
    runner: Runner,
    store: Store,
    records: dict[Point, dict[str, Any]],
    keys: dict[Point, str],
    hashes: dict[Source, str | None],
    digest: str,
    progress: bool,
    out: Path,
    total: int,
) -> dict[Point, str]:
    """Run `missing`, storing each as it finishes; the failed points' errors."""
    tasks = [Task(p, hashes[p.source], digest) for p in missing]
    version, at = code_version(), commit()
    errors: dict[Point, str] = {}
    bar = tqdm(total=len(tasks), desc="sweeping", unit="run", disable=not progress, leave=False)
    try:
        for outcome in runner.imap_unordered(execute, tasks):
            p = missing[outcome.index]
            bar.update()
            if outcome.error is not None:
                errors[p] = outcome.error
                continue
            record = {
                "key": keys[p],
                "version": version,
                "commit": at,
                "spec": p.spec(),
                "workload_sha256": hashes[p.source],
                "result": outcome.value,
                "executor": runner.description,
            }
            store.save(record)
            records[p] = record
    except KeyboardInterrupt:
        runner.terminate()
        raise Interrupted(len(records), total, out) from None
    finally:
        bar.close()
    return errors


def _hash(source: Source) -> str | None:
    path = workload_file(source)
    return file_sha256(path) if path is not None else None
