"""The tenants' and groups' numbers read over every pool's ledger (the admin API, /metrics): one ledger's own, or
with a ledger per pool (`per_model` scope) their sums: service, counters, queued and in flight."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ...core import Account, Ledger, LedgerView, TenantView


def view(ledgers: list[Ledger]) -> LedgerView:
    """Every tenant's and group's numbers, summed over `ledgers`."""
    views = [x.view() for x in ledgers]
    if len(views) == 1:
        return views[0]
    return LedgerView(views[0].policy, _views(v.tenants for v in views), _views(v.groups for v in views))


def accounts(ledgers: list[Ledger]) -> tuple[dict[str, Account], dict[str, Account], Callable[[Account], float]]:
    """(tenants, groups, counter_of) to read, summed over `ledgers`: with one ledger its own accounts, else read-only
    copies holding the sums (the ledgers' own accounts are written by their ledgers only)."""
    if len(ledgers) == 1:
        only = ledgers[0]
        return only.accounts, only.groups, only.policy.counter_of
    tenants = _accounts([(x.accounts, x.policy.counter_of) for x in ledgers])
    groups = _accounts([(x.groups, x.policy.counter_of) for x in ledgers])
    return tenants, groups, lambda a: a.counter


def _accounts(tables: list[tuple[dict[str, Account], Callable[[Account], float]]]) -> dict[str, Account]:
    sums: dict[str, list[Any]] = {}  # name -> [first account seen, service, counter, queued, running]
    for table, counter_of in tables:
        for name, a in table.items():
            s = sums.get(name)
            if s is None:
                s = sums[name] = [a, 0.0, 0.0, 0, 0]
            s[1] += a.service
            s[2] += counter_of(a)
            s[3] += a.queued
            s[4] += a.running
    return {
        name: Account(name, a.rank, a.weight, service, counter, queued, running, priority=a.priority)
        for name, (a, service, counter, queued, running) in sums.items()
    }


def _views(tables: Iterable[dict[str, TenantView]]) -> dict[str, TenantView]:
    out: dict[str, TenantView] = {}
    for table in tables:
        for name, v in table.items():
            s = out.get(name)
            out[name] = (
                v
                if s is None
                else TenantView(
                    name,
                    v.weight,
                    s.counter + v.counter,
                    s.service + v.service,
                    s.queued + v.queued,
                    s.running + v.running,
                    v.priority,
                )
            )
    return out
