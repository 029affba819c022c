"""A measured engine's profile: what `fairserve profile` writes and `--profile PATH` reads (simulate, sweep,
reproduce, emulate), in place of a preset's fitted constants.

The file (JSON, `"fairserve_profile": 1`) holds what was measured and on what:

    engine        {"kind": "vllm" | "http" | ..., "model": ..., "version": ..., "settings": {...}}
    kv_tokens     the engine's KV pool in tokens (blocks × block_tokens)
    block_tokens, max_num_seqs, max_batched_tokens    its limits as configured (null where unknown)
    rows          [{prompt_len, output_len, batch_size, prefill_s, decode_step_s[, prefill_fitted]}]: a batch of
                  `batch_size` requests of `prompt_len` tokens prefilled in one pass (`prefill_s`), then decoded
                  `output_len` steps (`decode_step_s`: their mean); the rows of the paper's A10G profile mean the
                  same. A row with `output_len` 1 measured a prefill only, one with `prefill_fitted` false decode
                  steps only: the other column is not fitted
    latency       the `LinearLatency` fitted to the rows when the file was written (for reading; the reader fits
                  again, so an edited row counts)

The fit is `profile_fit.fit_linear_latency` (non-negative least squares on relative error) over every row, with no
large-batch jump (a profile's batches are the engine's own range). A profile's steps are whole engine steps as the
engine's own loop timed them (scheduling and output handling included), so the fitted model has no separate
`StepOverhead`."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .latency import LINEAR_COEFFICIENTS, LinearLatency
from .profile_fit import ProfileRow, fit_errors, fit_linear_latency

SCHEMA = 1
ROW_FIELDS = ("prompt_len", "output_len", "batch_size", "prefill_s", "decode_step_s")


@dataclass(frozen=True)
class EngineProfile:
    kv_tokens: int
    rows: tuple[ProfileRow, ...]
    engine: dict[str, Any] = field(default_factory=dict)
    block_tokens: int | None = None
    max_num_seqs: int | None = None
    max_batched_tokens: int | None = None
    name: str = "profile"

    def __post_init__(self) -> None:
        if self.kv_tokens < 2:
            raise ValueError(f"kv_tokens must be >= 2, got {self.kv_tokens}")
        if len(self.rows) < 3:
            raise ValueError(f"a profile needs at least 3 rows to fit, got {len(self.rows)}")
        if not any(r.decode_fitted for r in self.rows):
            raise ValueError("a profile needs rows with output_len > 1 (decode steps)")
        if not any(r.prefill_fitted for r in self.rows):
            raise ValueError("a profile needs rows that measured a prefill (prefill_fitted)")

    def latency(self) -> LinearLatency:
        """The latency model fitted to the rows (every batch size: no large-batch jump)."""
        biggest = max(r.batch_size for r in self.rows)
        return fit_linear_latency(self.rows, name=self.name, large_batch_from=biggest)

    def errors(self) -> list[dict[str, Any]]:
        """Per row: measured, modelled and the relative error of the prefill pass and the decode step."""
        return fit_errors(self.latency(), self.rows)

    def to_dict(self) -> dict[str, Any]:
        fit = self.latency()
        return {
            "fairserve_profile": SCHEMA,
            "engine": self.engine,
            "kv_tokens": self.kv_tokens,
            "block_tokens": self.block_tokens,
            "max_num_seqs": self.max_num_seqs,
            "max_batched_tokens": self.max_batched_tokens,
            "rows": [asdict(r) for r in self.rows],
            "latency": {k: getattr(fit, k) for k in LINEAR_COEFFICIENTS},
        }

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: Any, name: str = "profile") -> EngineProfile:
        """ValueError naming what is wrong."""
        if not isinstance(data, dict) or data.get("fairserve_profile") != SCHEMA:
            raise ValueError(f'not a fairserve profile (expected "fairserve_profile": {SCHEMA})')
        rows = data.get("rows")
        if not isinstance(rows, list):
            raise ValueError("rows: expected a list")
        return cls(
            kv_tokens=_int(data, "kv_tokens"),
            rows=tuple(_row(i, r) for i, r in enumerate(rows)),
            engine=dict(data.get("engine") or {}) if isinstance(data.get("engine"), dict) else {},
            block_tokens=_int(data, "block_tokens", optional=True),
            max_num_seqs=_int(data, "max_num_seqs", optional=True),
            max_batched_tokens=_int(data, "max_batched_tokens", optional=True),
            name=name,
        )


def is_profile_path(name: str) -> bool:
    """Whether a `--profile` value names a file rather than a preset."""
    return name.endswith(".json") or os.sep in name


def load_engine_profile(path: str | Path) -> EngineProfile:
    """The profile in `path` (read once per file version). ValueError naming the file and the problem."""
    p = Path(path)
    try:
        stat = p.stat()
    except OSError as e:
        raise ValueError(f"profile {str(path)!r}: {e.strerror or e}") from None
    return _load(str(p.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=32)
def _load(path: str, mtime_ns: int, size: int) -> EngineProfile:
    try:
        data = json.loads(Path(path).read_text())
        return EngineProfile.from_dict(data, name=Path(path).stem)
    except (OSError, ValueError) as e:  # NOTE: json.JSONDecodeError is a ValueError
        raise ValueError(f"profile {path!r}: {e}") from None


def _int(data: dict[str, Any], key: str, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}: expected an integer >= 1, got {value!r}")
    return value


def _row(i: int, r: Any) -> ProfileRow:
    if not isinstance(r, dict) or set(ROW_FIELDS) - set(r):
        raise ValueError(f"rows[{i}]: expected an object with {', '.join(ROW_FIELDS)}")
    ints = [r[k] for k in ROW_FIELDS[:3]]
    floats = [r[k] for k in ROW_FIELDS[3:]]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in ints):
        raise ValueError(f"rows[{i}]: prompt_len, output_len and batch_size must be integers >= 1")
    if any(isinstance(v, bool) or not isinstance(v, int | float) or not (v > 0 and math.isfinite(v)) for v in floats):
        raise ValueError(f"rows[{i}]: prefill_s and decode_step_s must be seconds > 0")
    fitted = r.get("prefill_fitted", True)
    if not isinstance(fitted, bool):
        raise ValueError(f"rows[{i}]: prefill_fitted must be true or false")
    return ProfileRow(ints[0], ints[1], ints[2], float(floats[0]), float(floats[1]), prefill_fitted=fitted)
