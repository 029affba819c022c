"""Two of the paper's fairness quantities that every driver and report shares."""

from __future__ import annotations

from collections.abc import Iterable


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all are equal, 1/n when one gets everything; 1 for no values
    or all zeros."""
    xs = [float(v) for v in values]
    square = sum(v * v for v in xs)
    return 1.0 if square == 0 else sum(xs) ** 2 / (len(xs) * square)


def theorem_bound(max_prompt: float, kv_tokens: float, w_p: float = 1.0, w_q: float = 2.0) -> float:
    """Theorem 4.4's 2U = 2·max(w_p·L_in, w_q·M): the largest service difference VTC allows between two backlogged
    tenants (L_in: the longest prompt, M: the KV pool in tokens; linear cost)."""
    return 2.0 * max(w_p * max_prompt, w_q * kv_tokens)
