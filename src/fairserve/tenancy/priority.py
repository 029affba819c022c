"""A request's `priority` (vLLM's field) against what its tenant may name: the one check the gateway and
`fairserve serve` share, so a client cannot raise itself above its tier."""

from __future__ import annotations

from ..core import Ledger


def refused_priority(ledger: Ledger, tenant: str, named: int | None) -> list[int] | None:
    """None if a request of `tenant` may name priority `named` (or names none); else the values it may name: its
    own level and its configured `priorities`."""
    if named is None:
        return None
    allowed = ledger.allowed_priorities(tenant) | {ledger.priority_of(ledger.account(tenant))}
    return None if named in allowed else sorted(allowed)


def priority_message(tenant: str, named: int, allowed: list[int]) -> str:
    """The 400's message: it names the values the tenant may use."""
    return f"priority {named} is not allowed for tenant {tenant!r}; allowed: {', '.join(map(str, allowed))}"
