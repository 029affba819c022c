"""The mean over seeds and its 95% confidence interval: Student's t with n - 1 degrees of freedom (no SciPy: the t
quantile is found by bisection on the t distribution's CDF, through the regularized incomplete beta function)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float  # NaN when there are no values
    half: float  # half-width of the interval; NaN with fewer than two values
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half


def mean_ci(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Mean of `values` and the half-width of its `level` confidence interval, mean ± t·s/√n."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, 0)
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(mean, math.nan, 1)
    s = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return Interval(mean, t_quantile(0.5 + level / 2, n - 1) * s / math.sqrt(n), n)


@lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t distribution with `df` degrees of freedom (0 < p < 1)."""
    if not (0.0 < p < 1.0) or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return 0.5 * (lo + hi)


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Numerical Recipes §6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300

    def guard(v: float) -> float:
        return v if abs(v) >= tiny else tiny

    c, d = 1.0, 1.0 / guard(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, 500):
        even = m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m))
        d = 1.0 / guard(1.0 + even * d)
        c = guard(1.0 + even / c)
        h *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))
        d = 1.0 / guard(1.0 + odd * d)
        c = guard(1.0 + odd / c)
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h
