"""Request records of every `reproduce` run, frozen as digests: the simulator's output must stay bit for bit what
it was (the engine's rewrites, a flat tenant list read as a one-level tree). `python -m support.golden` (from
`tests/`) rewrites tests/data/reproduce_records.json after a change that is meant to alter the records."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

from fairserve.records import RequestRecord
from fairserve.reproduce.experiments import ALL_EXPERIMENTS
from fairserve.reproduce.runs import FLEET, RunOutput, RunSpec, run

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "reproduce_records.json"


def digest(records: list[RequestRecord]) -> str:
    """sha256 of every field of every record, floats by `repr` (exact)."""
    h = hashlib.sha256()
    for r in records:
        fields = (r.id, r.client, r.arrival_s, r.admit_s, r.first_token_s, r.finish_s, r.last_token_s)
        h.update(repr((*fields, r.prompt_tokens, r.output_tokens, r.max_tokens, r.status)).encode())
    return h.hexdigest()


def specs() -> list[RunSpec]:
    """Every distinct run of the suite, in a stable order."""
    seen: dict[str, RunSpec] = {}
    for e in ALL_EXPERIMENTS:
        for r in e.runs:
            seen.setdefault(key(r, quick=False), r)
    return list(seen.values())


def key(spec: RunSpec, quick: bool) -> str:
    weighted = "" if spec.weighted else " unweighted"
    flat = " flat" if spec.flat else ""
    mode = "" if spec.mode == "reserve" else f" mode={spec.mode}"
    mode += "" if spec.kv_tokens is None else f" kv={spec.kv_tokens}"
    mode += " prefix-cache" if spec.prefix_cache else ""
    mode += "" if spec.w_cached is None else f" w_cached={spec.w_cached:g}"
    mode += "".join(f" {k}={getattr(spec, k)}" for k in (*FLEET, "without") if getattr(spec, k) is not None)
    return f"{spec.workload} {spec.policy} cost={spec.cost}{weighted}{flat}{mode}{' quick' if quick else ''}"


@cache
def quick_run(spec: RunSpec) -> RunOutput:
    """The shortened (--quick) run, once per test session."""
    return run(spec, quick=True)


def compute() -> dict[str, str]:
    out = {}
    for spec in specs():
        out[key(spec, quick=True)] = digest(quick_run(spec).records)
        out[key(spec, quick=False)] = digest(run(spec).records)
    return out


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(compute(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
