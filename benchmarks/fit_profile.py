"""Refit the "a10g-llama2-7b" LinearLatency (forward only) from the shared A10G / Llama-2-7b profile.

Prints the fitted coefficients (as the Python literal `A10G_FORWARD` embedded in src/fairserve/sim/latency.py; decode
fitted on the rows of the operating range, batch <= 64, plus the median jump of the larger batches), whether the
embedded constants still match, the per-row fit error (a markdown table, as in docs/latency.md) and the roofline preset
"llama-2-7b@a10g" against the same rows.

    .venv/bin/python benchmarks/fit_profile.py [PROFILE_JSON]

Default profile: ../shared/profiles/a10g_llama2_7b_batch_profile.json (relative to the project root).
Exit status 1 if the embedded constants differ from the fit by more than 1e-6 relative.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from fairserve.sim.latency import (
    A10G_FORWARD,
    LINEAR_COEFFICIENTS,
    get_latency_model,
)
from fairserve.sim.profile_fit import PROFILE_FILENAME, fit_errors, fit_linear_latency, load_profile

COEFFS = LINEAR_COEFFICIENTS


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def main(argv: list[str]) -> int:
    default = Path(__file__).resolve().parents[2] / "shared" / "profiles" / PROFILE_FILENAME
    path = Path(argv[1]) if len(argv) > 1 else default
    if not path.exists():
        print(f"profile not found: {path}", file=sys.stderr)
        return 2
    rows = load_profile(path)
    fit = fit_linear_latency(rows)

    print(f"# fitted to {path} ({len(rows)} rows; non-negative least squares on relative error)")
    print("A10G_FORWARD = LinearLatency(")
    print(f'    name="{fit.name}",')
    for c in COEFFS:
        print(f"    {c}={getattr(fit, c)!r},")
    print(f"    large_batch_from={fit.large_batch_from},")
    print(")")

    # The unconstrained prefill fit, to show which term the constraint removed.
    a = np.array([[1.0, r.prefill_tokens, r.batch_size * r.prompt_len**2] for r in rows]) / np.array(
        [[r.prefill_s] for r in rows]
    )
    free, *_ = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)
    print(f"unconstrained prefill fit (fixed, per_token, per_sq_token): {free.tolist()}")

    same = all(math.isclose(getattr(fit, c), getattr(A10G_FORWARD, c), rel_tol=1e-6, abs_tol=1e-15) for c in COEFFS)
    print(f"embedded constants match the fit: {same}")

    roof = get_latency_model("llama-2-7b@a10g")
    print(
        "\n| prompt | output | batch | prefill s (profile) | fit | err | roofline "
        "| decode step ms (profile) | fit | err | roofline |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    errs = fit_errors(fit, rows)
    for e, r in zip(errs, fit_errors(roof, rows), strict=False):
        held = "" if e["decode_fitted"] else " (held out)"
        print(
            f"| {e['prompt_len']} | {e['output_len']} | {e['batch_size']} | {e['prefill_s']:.3f} | "
            f"{e['prefill_model_s']:.3f} | {_pct(e['prefill_err'])} | {r['prefill_model_s']:.3f} | "
            f"{1e3 * e['decode_step_s']:.1f}{held} | {1e3 * e['decode_model_s']:.1f} | {_pct(e['decode_err'])} | "
            f"{1e3 * r['decode_model_s']:.1f} |"
        )

    def summary(label: str, xs: list[float]) -> None:
        mx, mean = max(map(abs, xs)), sum(map(abs, xs)) / len(xs)
        print(f"{label}: max |err| {100 * mx:.1f}%, mean |err| {100 * mean:.1f}%, n={len(xs)}")

    print()
    summary("prefill (all rows)", [e["prefill_err"] for e in errs])
    limit = fit.large_batch_from
    summary(
        f"decode (fitted rows, output_len > 1, batch <= {limit})",
        [e["decode_err"] for e in errs if e["decode_fitted"] and e["batch_size"] <= limit],
    )
    summary(
        f"decode (output_len > 1, batch > {limit}: plane + large_batch_s)",
        [e["decode_err"] for e in errs if e["decode_fitted"] and e["batch_size"] > limit],
    )
    summary("decode (held out, output_len = 1)", [e["decode_err"] for e in errs if not e["decode_fitted"]])
    rp = [r["prefill_model_s"] / e["prefill_s"] for e, r in zip(errs, fit_errors(roof, rows), strict=False)]
    rd = [r["decode_model_s"] / e["decode_step_s"] for e, r in zip(errs, fit_errors(roof, rows), strict=False)]
    print(f"roofline/profile ratio: prefill {min(rp):.2f}..{max(rp):.2f}, decode {min(rd):.2f}..{max(rd):.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
