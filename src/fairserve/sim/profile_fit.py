"""Fitting a `LinearLatency` to a measured batch profile (the paper's A10G / Llama-2-7b one, `PROFILE_FILENAME` in
the shared data), and each profile row's error under any latency model: `benchmarks/fit_profile.py` and the
calibration tests use it; the simulator does not (its presets embed the fitted constants)."""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..workloads.base import DEFAULT_LATENCY_PROFILE
from .latency import OPERATING_MAX_BATCH, LatencyModel, LinearLatency

PROFILE_FILENAME = "a10g_llama2_7b_batch_profile.json"


@dataclass(frozen=True)
class ProfileRow:
    """One profile entry: a batch of `batch_size` requests prefilled once, then decoded `output_len` steps."""

    prompt_len: int
    output_len: int
    batch_size: int
    prefill_s: float  # the whole batch's prefill pass = prefill_s_per_request * batch_size
    decode_step_s: float  # one decode step = decode_s_per_request * batch_size / output_len
    prefill_fitted: bool = True  # False: the row measured decode steps only (its prefill column is held out)

    @property
    def prefill_tokens(self) -> int:
        return self.batch_size * self.prompt_len

    @property
    def context_tokens(self) -> float:
        """Average context over the decode steps: batch * (prompt + output/2)."""
        return self.batch_size * (self.prompt_len + self.output_len / 2)

    @property
    def decode_fitted(self) -> bool:
        """output_len = 1 rows measure prefill only (shared/README.md): their decode column is held out."""
        return self.output_len > 1


def profile_rows(profile: Mapping[str, Mapping[str, Sequence[float]]]) -> list[ProfileRow]:
    rows = []
    for p, by_out in profile.items():
        for o, (b, pre, dec) in by_out.items():
            p_, o_, b_ = int(p), int(o), int(b)
            rows.append(ProfileRow(p_, o_, b_, pre * b_, dec * b_ / o_))
    return sorted(rows, key=lambda r: (r.prompt_len, r.output_len))


def load_profile(path: str | Path) -> list[ProfileRow]:
    return profile_rows(json.loads(Path(path).read_text()))


def _nnls_relative(features: list[list[float]], targets: list[float]) -> list[float]:
    """argmin_{c >= 0} sum(((F c - y) / y)^2), exactly: the optimum is the unconstrained fit on its support, so try
    every support (2^k, k <= 3) and keep the best feasible one."""
    y = np.asarray(targets, dtype=float)
    a = np.asarray(features, dtype=float) / y[:, None]
    ones = np.ones_like(y)
    k = a.shape[1]
    best, best_res = np.zeros(k), float(np.sum(ones**2))
    for size in range(1, k + 1):
        for support in itertools.combinations(range(k), size):
            sol, *_ = np.linalg.lstsq(a[:, support], ones, rcond=None)
            if np.any(sol < 0):
                continue
            c = np.zeros(k)
            c[list(support)] = sol
            res = float(np.sum((a @ c - ones) ** 2))
            if res < best_res * (1 - 1e-12):
                best, best_res = c, res
    return [float(v) for v in best]


def fit_linear_latency(
    rows: Sequence[ProfileRow], name: str = DEFAULT_LATENCY_PROFILE, large_batch_from: int = OPERATING_MAX_BATCH
) -> LinearLatency:
    """Prefill: every row that measured it (`prefill_fitted`). Decode: rows with output_len > 1 and batch <=
    large_batch_from (the operating range), context = batch * (prompt + output/2); large_batch_s = the median excess
    of the larger-batch decode rows over that plane (0 if there are none). The result is forward-only (no
    StepOverhead), as the profile timed it."""
    pre_rows = [r for r in rows if r.prefill_fitted]
    pre = _nnls_relative(
        [[1.0, r.prefill_tokens, r.batch_size * r.prompt_len**2] for r in pre_rows], [r.prefill_s for r in pre_rows]
    )
    dec_rows = [r for r in rows if r.decode_fitted and r.batch_size <= large_batch_from]
    dec = _nnls_relative([[1.0, r.batch_size, r.context_tokens] for r in dec_rows], [r.decode_step_s for r in dec_rows])
    plane = LinearLatency(
        name,
        prefill_fixed_s=pre[0],
        prefill_per_token_s=pre[1],
        prefill_per_sq_token_s=pre[2],
        decode_fixed_s=dec[0],
        decode_per_seq_s=dec[1],
        decode_per_context_token_s=dec[2],
        large_batch_from=large_batch_from,
    )
    excess = [
        r.decode_step_s - plane.decode_step_s(r.batch_size, r.context_tokens)  # type: ignore[arg-type]
        for r in rows
        if r.decode_fitted and r.batch_size > large_batch_from
    ]
    return replace(plane, large_batch_s=max(0.0, statistics.median(excess)) if excess else 0.0)


def fit_errors(model: LatencyModel, rows: Sequence[ProfileRow]) -> list[dict[str, Any]]:
    """Per row: measured and modelled prefill pass and decode step (s), and relative errors (model/measured - 1).
    A model with a StepOverhead is compared without it (the profile timed the forward only)."""
    if isinstance(model, LinearLatency):
        model = model.forward_only()
    out = []
    for r in rows:
        pre = model.prefill_s([r.prompt_len] * r.batch_size)
        dec = model.decode_step_s(r.batch_size, r.context_tokens)  # type: ignore[arg-type]
        out.append(
            dict(
                prompt_len=r.prompt_len,
                output_len=r.output_len,
                batch_size=r.batch_size,
                prefill_s=r.prefill_s,
                prefill_model_s=pre,
                prefill_err=pre / r.prefill_s - 1,
                decode_step_s=r.decode_step_s,
                decode_model_s=dec,
                decode_err=dec / r.decode_step_s - 1,
                decode_fitted=r.decode_fitted,
                prefill_fitted=r.prefill_fitted,
            )
        )
    return out
