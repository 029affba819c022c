"""The event engine's clock (sim/engine.py): whole ticks (`sim/ticks.py`), and a run of decode steps as one move.

`Clock.t` is the engine's time in ticks (`now` is it in seconds) and `busy` the ticks spent prefilling and decoding.
A run of decode steps of an unchanged batch adds the steps' ticks in closed form (`ticks.run_ticks`), or, toward a
time, finds the first step that ends at or after it (`ticks.run_until`): O(1) whatever the run's length, and to the
tick the sum the step-by-step loop adds. A model without `decode_lines` has its steps added one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .latency import decode_lines
from .ticks import FOREVER, TICKS_PER_S, Lines, at_or_after, run_ticks, run_until, seconds, ticks

if TYPE_CHECKING:
    from .latency import LatencyModel

_S_PER_TICK = 1.0 / TICKS_PER_S


class Clock:
    """The engine's clock: `t`, `busy`, and `run` (a run of decode steps)."""

    __slots__ = ("latency", "t", "busy", "lines")

    def __init__(self, latency: LatencyModel) -> None:
        self.latency = latency
        self.t = 0  # the engine's clock, in ticks
        self.busy = 0  # ticks spent prefilling or decoding
        self.lines: dict[int, Lines] = {}  # the model's decode lines by batch size (none: added one by one)

    @property
    def now(self) -> float:
        """The engine's clock, in seconds."""
        return self.t * _S_PER_TICK  # NOTE: ticks.seconds(), inline

    @property
    def busy_s(self) -> float:
        """The time spent prefilling or decoding (the rest the engine was idle), in seconds."""
        return seconds(self.busy)

    def idle_until(self, t: float) -> None:
        """Nothing to do until `t` seconds: the clock moves there (never back; nowhere for an infinite time)."""
        until = at_or_after(t)
        if self.t < until < FOREVER:
            self.t = until

    def spend(self, dt: int) -> None:
        """Work of `dt` ticks (a prefill)."""
        self.t += dt
        self.busy += dt

    def run(self, n: int, steps: int, until: int, kv_used: int) -> int:
        """Decode `steps` steps of the batch of `n` from `kv_used` tokens of context, stopping after the first that
        ends at or after tick `until` (`FOREVER`: none); returns how many (at least one)."""
        lines = self.lines.get(n)
        if lines is None:
            lines = self.lines[n] = decode_lines(self.latency, n) or ()
        if not lines:
            return self._one_by_one(n, steps, until, kv_used)
        if until == FOREVER:
            done, spent = steps, run_ticks(lines, n, kv_used, steps)
        else:
            done, spent = run_until(lines, n, kv_used, steps, until - self.t)
        self.t += spent
        self.busy += spent
        return done

    def _one_by_one(self, n: int, steps: int, until: int, kv: int) -> int:
        """A model without decode lines: each step rounded to ticks, added in turn."""
        one, t, done = self.latency.decode_step_s, self.t, 0
        while True:
            t += ticks(one(n, kv + n * done))
            done += 1
            if done == steps or t >= until:
                break
        self.busy += t - self.t
        self.t = t
        return done
