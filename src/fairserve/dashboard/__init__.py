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

HISTORY_S = 300.0  # the chart's span: the last five minutes
MIN_INTERVAL_S = 0.5  # snapshots closer than this are not kept (several viewers poll the same history)
RATE_WINDOW_S = 5.0  # a service rate is the service received over the preceding few seconds
MAX_SAMPLES = int(HISTORY_S / MIN_INTERVAL_S) + 1
MAX_POINTS = 150  # points per tenant sent to the chart (every k-th sample, the latest always)

BackendRows = Callable[[], list[dict[str, Any]]]
"""What a server with backends (the gateway) passes: one JSON row per backend (url, healthy, in-flight, limit)."""


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # monotonic seconds
    service: dict[str, float]  # tenant -> service received so far
    rate: dict[str, float] | None  # tenant -> service per second over the window before t (None: no sample in it)
    span_s: float | None = None  # the seconds that rate is over: the window, or longer after an idle gap


class History:
    """At most `MAX_SAMPLES` snapshots of each tenant's service over the last `HISTORY_S` seconds, each with the
    service rates up to it (computed once, when it is taken)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.samples: deque[Sample] = deque(maxlen=MAX_SAMPLES)
        self._rates: tuple[list[float], dict[str, list[float | None]]] | None = None
        self._tenants: list[str] = []  # the chart's lines: the tenants (the samples also hold the groups)

    def sample(self, view: LedgerView, tenants: Sequence[str]) -> None:
        now = self.clock()
        if self.samples and now - self.samples[-1].t < MIN_INTERVAL_S:
            return
        self._tenants = sorted(t for t in tenants if t in view.tenants)
        service = {t: view.tenants[t].service for t in tenants if t in view.tenants}
        service.update((g, row.service) for g, row in view.groups.items())
        first = None  # the earliest sample within the window before now
        for s in reversed(self.samples):
            if now - s.t > RATE_WINDOW_S:
                break
            first = s
        if first is None and self.samples:  # NOTE: after a gap: the rate over the gap, not the last one before it
            first = self.samples[-1]
        rate, dt = None, None
        if first is not None:
            dt = now - first.t
            # NOTE: reconciliation can take back a little service; a rate below zero would mean nothing
            rate = {t: max(0.0, (v - first.service[t]) / dt) for t, v in service.items() if t in first.service}
        self.samples.append(Sample(now, service, rate, dt))
        while now - self.samples[0].t > HISTORY_S:
            self.samples.popleft()
        self._rates = None

    def rates(self) -> tuple[list[float], dict[str, list[float | None]]]:
        """(times in seconds before the latest sample, {tenant: its service rate at each time, None where unknown}),
        for at most `MAX_POINTS` of the samples that have rates."""
        if self._rates is None:
            samples = [s for s in self.samples if s.rate is not None]
            stride = max(1, -(-len(samples) // MAX_POINTS))
            samples = samples[::-1][::stride][::-1]
            last = self.samples[-1].t if self.samples else 0.0
            tenants = self._tenants  # the configured tenants
            self._rates = (
                [round(s.t - last, 3) for s in samples],
                {t: [_round((s.rate or {}).get(t)) for s in samples] for t in tenants},
            )
        return self._rates


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def snapshot(
    view: LedgerView, tenants: Sequence[str], history: History, backends: BackendRows | None = None
) -> dict[str, Any]:
    """The dashboard's JSON: every configured tenant's row and current rate, the fairness numbers, the rate history
    and (on the gateway) the backends."""
    history.sample(view, tenants)
    times, rates = history.rates()
    rows, known = [], set(tenants)
    for t in tenants:
        if t in view.tenants:
            now = history.samples[-1].rate or {}  # the rate at this sample, never an older one's
            rows.append({**view.tenants[t].row(), "rate": _round(now.get(t)) or 0.0})
    return {
        "policy": view.policy,
        "tenants": rows,
        "tree": tree(view, tenants, history.samples[-1].rate) if view.groups else None,
        "backlogged": [t.tenant for t in view.backlogged if t.tenant in known],
        "counter_spread": view.counter_spread,
        "jain": view.jain,
        "history": {
            "span_s": HISTORY_S,
            "window_s": RATE_WINDOW_S,
            "rate_span_s": _round(history.samples[-1].span_s),  # what the current rates are over (None: no rates)
            "t": times,
            "rates": rates,
        },
        "backends": backends() if backends is not None else None,
    }


def tree(view: LedgerView, tenants: Sequence[str], rates: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The tenant tree, top nodes first, each node's admin row plus its `path`, `kind` (group or tenant), `share`
    (of its siblings' service rate now, or of their service so far while nothing is served) and `children`, in the
    order the tenants are configured."""
    top: list[dict[str, Any]] = []
    by_path: dict[str, dict[str, Any]] = {}
    for t in tenants:
        if t not in view.tenants:
            continue
        parts = t.split("/")
        siblings = top
        for depth in range(1, len(parts) + 1):
            path = "/".join(parts[:depth])
            node = by_path.get(path)
            if node is None:
                leaf = depth == len(parts)
                row = (view.tenants if leaf else view.groups)[path]
                node = by_path[path] = {
                    **row.row(),
                    "name": parts[depth - 1],
                    "path": path,
                    "kind": "tenant" if leaf else "group",
                    "rate": _round((rates or {}).get(path)) or 0.0,
                    "children": [],
                }
                siblings.append(node)
            siblings = node["children"]
    _shares(top)
    return top


def _shares(siblings: list[dict[str, Any]]) -> None:
    key = "rate" if any(n["rate"] > 0 for n in siblings) else "service"
    total = sum(n[key] for n in siblings)
    for n in siblings:
        n["share"] = round(n[key] / total, 4) if total > 0 else 0.0
        _shares(n["children"])


def asset(name: str) -> bytes:
    """A file of the page (HTML, script, style), shipped in the package."""
    return resources.files(__package__).joinpath("static", name).read_bytes()
