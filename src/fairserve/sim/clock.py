"""How the event engine (sim/engine.py) moves its clock over a run of decode steps, as a mixin of `SimEngine`.

Every step's duration comes from the latency model and is added to the clock (and to the busy time) in order, one at
a time, exactly as the step-by-step loop adds them, so that every time is the same float. Short runs are added up in
Python (a linear model's steps written out); long ones are one vectorised call of the model (`decode_steps_s`) and a
sequential cumulative sum, kept while the batch stays the same: an arrival cuts a run, and the sum continued from
where it was cut is the same sum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .latency import LinearLatency, decode_steps_s

if TYPE_CHECKING:
    from .latency import LatencyModel

SHORT_RUN = 32  # decode runs up to this many steps are added up in Python (numpy's calls cost more)
LONG_RUN = 1024  # a run toward a time (an arrival) is computed this far at least (what is left is kept for later)
NO_RUN = (np.zeros(0), np.zeros(0), 0)


class DecodeClock:
    """The engine's clock over decode steps: `_run_steps` (what the engine calls) and the runs it keeps."""

    latency: LatencyModel
    now: float
    busy_s: float
    kv_used: int
    step: int

    def _open_clock(self) -> None:
        self._linear = self.latency if type(self.latency) is LinearLatency else None  # its steps can be written out
        self._run: tuple[np.ndarray, np.ndarray, int] = NO_RUN  # the last decode run: clock, busy time, first step
        self._run_at = (0, 0)  # ... and its batch size and context at its first step (the durations depend on these)

    def _run_steps(self, n: int, steps: int, until: float) -> int:
        """Decode `steps` steps of the batch (stopping after the first that ends at or after `until`); returns how
        many. Durations are added one at a time, in order, exactly as a loop over the steps adds them."""
        now, busy, kv, one = self.now, self.busy_s, self.kv_used, self.latency.decode_step_s
        dt = one(n, kv)
        if dt > 0 and until - now < (SHORT_RUN - 1) * dt:
            steps = min(steps, SHORT_RUN)  # NOTE: steps only grow longer with the context: `until` comes first
        done = 0
        if steps <= SHORT_RUN:
            linear = self._linear
            a, b, c = linear.decode_step_terms(n) if linear is not None else (0.0, 0.0, 0.0)
            while True:
                now += dt
                busy += dt
                kv += n
                done += 1
                if done == steps or now >= until:
                    break
                # NOTE: a linear model's step written out (LinearLatency.decode_step_s), saving a call per step
                dt = a + b * kv + c if linear is not None else one(n, kv)
        else:
            bounded = until != float("inf")
            while done < steps and now < until:
                at = self.step + done
                nows, busys, k = self._run
                k = at - k
                if not (
                    0 < k < len(nows)
                    and (n, kv - n * k) == self._run_at
                    and nows[k - 1] == now
                    and busys[k - 1] == busy
                ):
                    take = steps - done
                    if dt > 0 and bounded and take > LONG_RUN:
                        take = max(LONG_RUN, int((until - now) / dt) + 2)
                    nows, busys = self._decode_run(n, kv, take, now, busy)
                    self._run, self._run_at, k = (nows, busys, at), (n, kv), 0
                run = nows[k : k + steps - done]
                take = len(run)
                if bounded:
                    take = min(take, int(run.searchsorted(until)) + 1)
                now, busy = float(run[take - 1]), float(busys[k + take - 1])
                kv += n * take
                done += take
                if done < steps and now < until:
                    dt = one(n, kv)
        self.now, self.busy_s = now, busy
        return done

    def _decode_run(self, n: int, kv: int, steps: int, now: float, busy: float) -> tuple[np.ndarray, np.ndarray]:
        """The clock and the busy time after each of `steps` decode steps of a batch of `n` from `now`, `busy`: each
        step's duration added in order, as a loop adds them. Kept (`_run`) while the batch stays the same: arrivals
        cut a run into pieces, and a sum continued from where it was cut is the same sum."""
        dts = (
            self._linear.decode_steps_s(n, kv, steps)
            if self._linear is not None
            else decode_steps_s(self.latency, n, kv, steps)
        )
        first = float(dts[0])
        dts[0] = first + now  # NOTE: the first sum, then a sequential cumsum: the same sums as the loop's
        nows = np.add.accumulate(dts)
        dts[0] = first + busy
        np.add.accumulate(dts, out=dts)
        return nows, dts
