"""The per-tenant Prometheus series: the tenants in use only (`TenantActivity`), rendered by `TenantCollector`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..core.account import parents

if TYPE_CHECKING:
    from .admin import Accounts


# (TenantView field, family name, type, help): the per-tenant live values every server in front of a ledger exports
TENANT_FAMILIES = (
    (
        "service",
        "service",
        "counter",
        "Service charged by the policy: w_p*prompt + w_q*output (live; reconciliation may correct it slightly)",
    ),
    ("counter", "counter", "gauge", "The policy's virtual counter (service / weight, lifted)"),
    ("queued", "queue_length", "gauge", "Queued requests"),
    ("running", "tenant_inflight_requests", "gauge", "Requests being served"),
    ("weight", "tenant_weight", "gauge", "Tenant weight"),
)
SPREAD_HELP = "Max minus min counter among backlogged tenants"
JAIN_HELP = "Jain's index of weighted service among backlogged tenants"
METRICS_WINDOW_S = 900.0  # a tenant's series stay this long after its last request


class TenantActivity:
    """Which tenants have Prometheus series: those with requests queued or running, and those that sent or ended one
    in the last `window_s` seconds. The others leave the exposition (their counts are kept and come back with them),
    so a scrape's size follows the tenants in use, not the tenants configured. Every per-tenant series follows this
    rule."""

    def __init__(self, window_s: float = METRICS_WINDOW_S, clock: Any = time.monotonic) -> None:
        self.window_s, self.clock = window_s, clock
        self._seen: dict[str, float] = {}  # tenant -> when it last sent or ended a request

    def saw(self, tenant: str) -> None:
        self._seen[tenant] = self.clock()

    def active(self, busy: Any) -> list[str]:
        """The tenants with series now, in first-seen order; `busy(tenant)`: whether it has requests queued or
        running. O(tenants seen in the window)."""
        cutoff = self.clock() - self.window_s
        out, idle = [], []
        for tenant, at in self._seen.items():
            if at >= cutoff or busy(tenant):
                out.append(tenant)
            else:
                idle.append(tenant)
        for tenant in idle:  # NOTE: forgotten until its next request: the scan stays O(active)
            del self._seen[tenant]
        return out


class TenantCollector:
    """Per-tenant service, counter, queue, in-flight requests and weight, plus the backlogged counter spread and
    Jain's index, read from the ledger at scrape time. Labels: the configured tenants only (with `activity`, only
    those it names active)."""

    def __init__(
        self, accounts: Accounts, tenants: list[str], prefix: str, activity: TenantActivity | None = None
    ) -> None:
        self.accounts, self.tenants, self.prefix, self.activity = accounts, tenants, prefix, activity

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        view, p = self.accounts.view(), self.prefix
        families = {
            field: (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(p + name, text, labels=["tenant"])
            for field, name, kind, text in TENANT_FAMILIES
        }
        tenants = self.tenants
        if self.activity is not None:
            known = set(tenants)

            def busy(t: str) -> bool:
                row = view.tenants.get(t)
                return row is not None and bool(row.queued or row.running)

            tenants = [t for t in self.activity.active(busy) if t in known]
        for t in tenants:
            row = view.tenants.get(t)
            for field, family in families.items():
                family.add_metric([t], float(getattr(row, field)) if row is not None else 0.0)
        yield from families.values()
        if view.groups:  # NOTE: the groups above the tenants shown, as the gateway's (5 series a group)
            shown = {g for t in tenants for g in parents(t)}
            for field, name, kind, text in TENANT_FAMILIES:
                family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                    p + "group_" + name.removeprefix("tenant_"), text.replace("Tenant", "Group"), labels=["group"]
                )
                for g, row in view.groups.items():
                    if g in shown:
                        family.add_metric([g], float(getattr(row, field)))
                yield family
        yield GaugeMetricFamily(p + "backlogged_counter_spread", SPREAD_HELP, value=view.counter_spread)
        yield GaugeMetricFamily(p + "jain_index", JAIN_HELP, value=view.jain)
