"""The live dashboard: `/dashboard` (a static page, no data in it) and `GET /admin/dashboard` (its data, admin key
only), mounted by `tenancy.admin_router` on every server in front of a ledger (the gateway, `fairserve serve`).

Service rates need history: `History` keeps a bounded ring of `view()` snapshots, sampled when the JSON is asked for
(at most every `MIN_INTERVAL_S`), so nothing runs while nobody watches.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..core import LedgerView

HISTORY_S = 300.0         # the chart's span: the last five minutes
MIN_INTERVAL_S = 0.5      # snapshots closer than this are not kept (several viewers poll the same history)
RATE_WINDOW_S = 5.0       # a service rate is the service received over the preceding few seconds
MAX_SAMPLES = int(HISTORY_S / MIN_INTERVAL_S) + 1

BackendRows = Callable[[], list[dict[str, Any]]]
"""What a server with backends (the gateway) passes: one JSON row per backend (url, healthy, in-flight, limit)."""


@dataclass(frozen=True, slots=True)
class Sample:
    t: float                      # monotonic seconds
    service: dict[str, float]     # tenant -> service received so far


class History:
    """At most `MAX_SAMPLES` snapshots of each tenant's service over the last `HISTORY_S` seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.samples: deque[Sample] = deque(maxlen=MAX_SAMPLES)

    def sample(self, view: LedgerView, tenants: Sequence[str]) -> None:
        now = self.clock()
        if self.samples and now - self.samples[-1].t < MIN_INTERVAL_S:
            return
        self.samples.append(Sample(now, {t: view.tenants[t].service for t in tenants if t in view.tenants}))
        while now - self.samples[0].t > HISTORY_S:
            self.samples.popleft()

    def rates(self) -> tuple[list[float], dict[str, list[float | None]]]:
        """(times in seconds before now, {tenant: service per second at each time}); a tenant's rate at sample i is
        its service gained since the earliest sample within `RATE_WINDOW_S` before i (None where there is none)."""
        samples, now = list(self.samples), self.clock()
        tenants = {t for s in samples for t in s.service}
        times: list[float] = []
        out: dict[str, list[float | None]] = {t: [] for t in sorted(tenants)}
        j = 0
        for i, s in enumerate(samples):
            while j < i and s.t - samples[j].t > RATE_WINDOW_S:
                j += 1
            if j == i:          # nothing before it in the window: no rate yet
                continue
            first, dt = samples[j], s.t - samples[j].t
            times.append(round(s.t - now, 3))
            for t in out:
                if t in s.service and t in first.service:
                    # NOTE: reconciliation can take back a little service; a rate below zero would mean nothing
                    out[t].append(max(0.0, (s.service[t] - first.service[t]) / dt))
                else:
                    out[t].append(None)
        return times, out


def snapshot(view: LedgerView, tenants: Sequence[str], history: History,
             backends: BackendRows | None = None) -> dict[str, Any]:
    """The dashboard's JSON: every configured tenant's row and current rate, the fairness numbers, the rate history
    and (on the gateway) the backends."""
    history.sample(view, tenants)
    times, rates = history.rates()
    rows, known = [], set(tenants)
    for t in tenants:
        if t in view.tenants:
            series = rates.get(t) or [None]
            rows.append({**view.tenants[t].row(), "rate": series[-1] or 0.0})
    return {"policy": view.policy, "tenants": rows,
            "backlogged": [t.tenant for t in view.backlogged if t.tenant in known],
            "counter_spread": view.counter_spread, "jain": view.jain,
            "history": {"span_s": HISTORY_S, "window_s": RATE_WINDOW_S, "t": times, "rates": rates},
            "backends": backends() if backends is not None else None}


def asset(name: str) -> bytes:
    """A file of the page (HTML, script, style), shipped in the package."""
    return resources.files(__package__).joinpath("static", name).read_bytes()
