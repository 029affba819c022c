"""The simulator's time base: whole ticks of 2^-64 s, and the closed-form sum of a run of decode steps.

A latency model's durations are rounded once each to a whole number of ticks (`ticks`), and the engine's clock adds
ticks. Integer sums are exact whatever their grouping, so the clock after a run of decode steps has a closed form
(`run_ticks`, `run_until`) that is, to the tick, the sum a step-by-step loop adds: the event engine moves over a run in
O(1) and its clock is the loop's, bit for bit. Times leave the simulator as float seconds (`seconds`, correctly
rounded); an instant given in seconds (an arrival, a horizon) is the first tick at or after it (`at_or_after`), exact
for any time from 2^-12 s on, as 2^64 ticks a second make every such float a whole number of ticks.

A decode step's duration is `step_ticks(lines, context)`: the largest `a + b·context` over the model's lines (a, b)
for the batch size (`LatencyModel.decode_lines`), b >= 0. The context grows by the batch size every step, so over a
run each line is an arithmetic sequence and the step's duration is convex in the step: the line that gives the
largest value changes at most once per line, at a step found by integer division, and each stretch sums in closed
form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

TICKS_PER_S = 1 << 64
FOREVER = 1 << 128  # a tick never reached (2^64 seconds): the instant of an infinite time
_PER_S = float(TICKS_PER_S)  # 2.0 ** 64: multiplying a float by it is exact
_S_PER_TICK = 1.0 / _PER_S

Lines = Sequence[tuple[int, int]]  # a decode step at context x takes max(a + b·x) ticks over the lines (a, b)


def ticks(seconds: float) -> int:
    """A duration, rounded to the nearest tick."""
    return round(seconds * _PER_S)


def at_or_after(seconds: float) -> int:
    """An instant: the first tick at or after it (the engine's clock is at or past it exactly when it is at or past
    this tick); `FOREVER` for an infinite time."""
    return math.ceil(seconds * _PER_S) if seconds != math.inf else FOREVER


def seconds(t: int) -> float:
    """Ticks as float seconds (correctly rounded: an int becomes the nearest float, then an exact power-of-two
    scaling)."""
    return t * _S_PER_TICK


def step_ticks(lines: Lines, x: int) -> int:
    """One decode step's duration at context `x`."""
    if len(lines) == 1:
        a, b = lines[0]
        return a + b * x
    return max(a + b * x for a, b in lines)


def _line_sum(a: int, b: int, n: int, x: int, k: int) -> int:
    """Σ_{j<k} a + b·(x + n·j)."""
    return k * a + b * (k * x + n * (k * (k - 1) // 2))


def _stretches(lines: Lines, n: int, x: int, k: int) -> list[tuple[int, int, int, int]]:
    """The run of `k` steps from context `x` as stretches (first step, steps, a, b), each on the one line that gives
    its steps' durations."""
    if len(lines) == 1:
        a, b = lines[0]
        return [(0, k, a, b)]
    out, j = [], 0
    while j < k:
        xj = x + n * j
        a, b = max(lines, key=lambda line: (line[0] + line[1] * xj, line[1]))  # NOTE: a tie goes to the steeper
        end = k
        for a2, b2 in lines:
            if b2 > b:  # it overtakes at the first step where (b2 - b)·(x + n·i) >= a - a2
                end = min(end, j + -(-(a - a2 - (b2 - b) * xj) // ((b2 - b) * n)))
        out.append((j, end - j, a, b))
        j = end
    return out


def run_ticks(lines: Lines, n: int, x: int, k: int) -> int:
    """The ticks of `k` decode steps of a batch of `n` from context `x` (the context grows by `n` a step)."""
    if len(lines) == 1:  # NOTE: one line (most models), without the stretches
        a, b = lines[0]
        return k * a + b * (k * x + n * (k * (k - 1) // 2))
    return sum(_line_sum(a, b, n, x + n * j, m) for j, m, a, b in _stretches(lines, n, x, k))


def run_until(lines: Lines, n: int, x: int, k: int, budget: int) -> tuple[int, int]:
    """(steps, their ticks) for the fewest steps, at least one and at most `k`, whose ticks add up to `budget` or
    more; (k, the ticks of all k) if they never do."""
    done = spent = 0
    for j, m, a, b in _stretches(lines, n, x, k):
        xj = x + n * j
        whole = _line_sum(a, b, n, xj, m)
        if spent + whole < budget:
            done, spent = done + m, spent + whole
            continue
        i = _first_reaching(a, b, n, xj, m, budget - spent)
        return done + i, spent + _line_sum(a, b, n, xj, i)
    return done, spent


def _first_reaching(a: int, b: int, n: int, x: int, m: int, need: int) -> int:
    """The smallest i in 1..m with Σ_{j<i} a + b·(x + n·j) >= need (one exists: the sum of all m does)."""
    if need <= a + b * x:
        return 1
    # NOTE: the root of (b·n/2)·i² + (a + b·x - b·n/2)·i = need in floats, then corrected in integers (the float is
    # off by a step at most)
    p, q = b * n / 2.0, float(a + b * x) - b * n / 2.0
    root = math.sqrt(q * q + 4.0 * p * need)
    guess = 2.0 * need / (q + root) if q > 0 else (root - q) / (2.0 * p)
    i = min(m, max(1, math.ceil(guess)))
    while i > 1 and _line_sum(a, b, n, x, i - 1) >= need:
        i -= 1
    while _line_sum(a, b, n, x, i) < need:
        i += 1
    return i
