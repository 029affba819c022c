"""The event engine's clock (sim/engine.py), as a mixin of `SimEngine`: whole ticks (`sim/ticks.py`), and a run of
decode steps as one move.

The engine's time is `_t` ticks (`now` is it in seconds) and `_busy` the ticks spent prefilling and decoding. A run of
decode steps of an unchanged batch adds the steps' ticks in closed form (`ticks.run_ticks`), or, toward a time, finds
the first step that ends at or after it (`ticks.run_until`): O(1) whatever the run's length, and to the tick the sum
the step-by-step loop adds. A model without `decode_lines` has its steps added one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .latency import decode_lines
from .ticks import FOREVER, TICKS_PER_S, Lines, at_or_after, run_ticks, run_until, seconds, ticks

if TYPE_CHECKING:
    from .latency import LatencyModel

_S_PER_TICK = 1.0 / TICKS_PER_S


class DecodeClock:
    """The engine's clock: `_t`, `_busy`, and `_run_steps` (what the engine calls for a run of decode steps)."""

    latency: LatencyModel
    kv_used: int

    def _open_clock(self) -> None:
        self._t = 0  # the engine's clock, in ticks
        self._busy = 0  # ticks spent prefilling or decoding
        self._lines: dict[int, Lines] = {}  # the model's decode lines by batch size (none: added one by one)

    @property
    def now(self) -> float:
        """The engine's clock, in seconds."""
        return self._t * _S_PER_TICK  # NOTE: ticks.seconds(), inline

    @property
    def busy_s(self) -> float:
        """The time spent prefilling or decoding (the rest the engine was idle), in seconds."""
        return seconds(self._busy)

    def idle_until(self, t: float) -> None:
        """Nothing to do until `t` seconds: the clock moves there (never back; nowhere for an infinite time)."""
        until = at_or_after(t)
        if self._t < until < FOREVER:
            self._t = until

    def _run_steps(self, n: int, steps: int, until: int) -> int:
        """Decode `steps` steps of the batch of `n`, stopping after the first that ends at or after tick `until`
        (`FOREVER`: none); returns how many (at least one)."""
        lines = self._lines.get(n)
        if lines is None:
            lines = self._lines[n] = decode_lines(self.latency, n) or ()
        if not lines:
            return self._one_by_one(n, steps, until)
        if until == FOREVER:
            done, spent = steps, run_ticks(lines, n, self.kv_used, steps)
        else:
            done, spent = run_until(lines, n, self.kv_used, steps, until - self._t)
        self._t += spent
        self._busy += spent
        return done

    def _one_by_one(self, n: int, steps: int, until: int) -> int:
        """A model without decode lines: each step rounded to ticks, added in turn."""
        one, kv, t, done = self.latency.decode_step_s, self.kv_used, self._t, 0
        while True:
            t += ticks(one(n, kv + n * done))
            done += 1
            if done == steps or t >= until:
                break
        self._busy += t - self._t
        self._t = t
        return done
