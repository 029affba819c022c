"""The fleet's auto-scaling rule (sim/fleet.py): when to ask for an engine, when to let one go.

- **Out**: when the oldest request in the fleet's queue has waited `wait_s`, no engine is starting and fewer than
  `high` are up or starting, one engine is asked for; it takes requests `delay_s` later (its start-up: loading the
  model, warming up), and costs from the moment it is asked for.
- **In**: with nothing queued, an engine that has had nothing in flight for `idle_s` is let go (the newest first),
  down to `low`.

Engine-seconds, the cost, count every engine from the moment it is asked for to the moment it is let go (or the
run's end). The rule reads only what a real autoscaler can: the queue's oldest wait and each engine's idle time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scaling:
    low: int  # engines always up
    high: int  # engines at most
    wait_s: float = 10.0  # ask for an engine when the oldest queued request has waited this long
    delay_s: float = 60.0  # an engine takes requests this long after it is asked for
    idle_s: float = 60.0  # let an engine go after this long with nothing in flight (and nothing queued)

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"--autoscale MIN:MAX needs 1 <= MIN <= MAX, got {self.low}:{self.high}")
        if min(self.wait_s, self.delay_s, self.idle_s) < 0:
            raise ValueError("the scaling delays (--scale-wait, --scale-delay, --scale-idle) must be >= 0")


def parse_autoscale(text: str) -> tuple[int, int]:
    """`MIN:MAX` -> (MIN, MAX); ValueError with one line."""
    low, sep, high = text.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"--autoscale takes MIN:MAX engines, e.g. 1:8, got {text!r}")
    return int(low), int(high)
