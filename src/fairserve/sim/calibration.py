"""The paper's measured A10G runs the "a10g-llama2-7b" preset is calibrated against, and how they are counted.

Four runs of the paper's artifact (S-LoRA with VTC or FCFS, Llama-2-7b on one A10G, 10,000-token pool) are the
calibration set; nothing else was used to choose the preset's constants (docs/latency.md). Service is counted as the
paper's plots count it: each request's service w_p·prompt + w_q·output spread evenly over [first token, finish], and
the part overlapping the window [0, window_s] counted, so a request still running at the window's end counts in
part. That needs each request's finish time, so a calibration run simulates past the window (`TAIL_S`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..records import RequestRecord
from ..workloads import get_workload
from . import simulate

TAIL_S = 120.0  # simulated past the window, so that requests running at its end finish


@dataclass(frozen=True)
class MeasuredRun:
    workload: str
    policy: str
    window_s: float
    service_per_s: float  # prompt + 2 · output tokens per second over the window
    output_tokens_per_s: float


# The paper's artifact, measured on an A10G (the calibration data of the preset).
CALIBRATION_RUNS: tuple[MeasuredRun, ...] = (
    MeasuredRun("overload", "vtc", 360.0, 1340.0, 446.8),
    MeasuredRun("overload", "fcfs", 360.0, 1305.0, 435.0),
    MeasuredRun("poisson-short-long", "vtc", 600.0, 2035.0, 678.3),
    MeasuredRun("poisson-short-long", "fcfs", 600.0, 2230.0, 743.5),
)


def window_service(
    records: Sequence[RequestRecord], window_s: float, w_p: float = 1.0, w_q: float = 2.0
) -> tuple[float, float]:
    """(service, output tokens) inside [0, window_s], each request's share spread evenly over [first token, end]."""
    service = output = 0.0
    for r in records:
        first = r.first_token_s
        if first is None or first >= window_s or r.output_tokens <= 0:
            continue
        end = r.finish_s if r.finish_s is not None else (r.last_token_s or first)
        share = 1.0 if end <= window_s else (window_s - first) / (end - first)
        service += share * (w_p * r.prompt_tokens + w_q * r.output_tokens)
        output += share * r.output_tokens
    return service, output


@dataclass(frozen=True)
class CalibrationResult:
    run: MeasuredRun
    service_per_s: float
    output_tokens_per_s: float

    @property
    def error(self) -> float:
        """simulated / measured service - 1."""
        return self.service_per_s / self.run.service_per_s - 1.0


def simulate_run(run: MeasuredRun, latency: object | None = None) -> CalibrationResult:
    """Simulate one measured run on the default preset (or `latency`, a preset name or LatencyModel)."""
    w = get_workload(run.workload, duration_s=run.window_s)
    res = simulate(w, run.policy, latency=latency, until_s=run.window_s + TAIL_S)
    service, output = window_service(res.records, run.window_s)
    return CalibrationResult(run, service / run.window_s, output / run.window_s)
