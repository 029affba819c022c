"""Scoring a bench run against the server's tenant tree (`GET /admin/tree`).

While a set of tenants is backlogged, the tree says what each should get: the best priority level with a backlogged
tenant is served alone, and within it a backlogged tenant's share is the product, along its path from the top, of
`w / Σ w` over the node and its siblings that have a backlogged tenant at that level below them (tenants at worse
levels get 0). The measured share is each tenant's part of the service given to backlogged tenants in the same
moments (on the bench's time grid), so the two are compared over the same stretches however the backlog changes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from ..core.account import parents
from ..metrics import backlogged, service_curves, time_grid
from ..records import RequestRecord


@dataclass(frozen=True, slots=True)
class Node:
    path: str
    weight: float
    priority: int  # the level its requests run at when they name none
    leaf: bool


def read_tree(target: str, admin_key: str, timeout_s: float = 10.0) -> dict[str, Node]:
    """Every node of the server's tree, by path; ValueError (one line) when it cannot be read."""
    base = target.strip().rstrip("/").removesuffix("/v1")
    try:
        r = httpx.get(base + "/admin/tree", headers={"Authorization": f"Bearer {admin_key}"}, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise ValueError(f"--admin-key: cannot read the tenant tree from {base}: {e}") from None
    if r.status_code != 200:
        raise ValueError(f"--admin-key: {base} refused GET /admin/tree (HTTP {r.status_code})")
    nodes: dict[str, Node] = {}

    def walk(rows: list[dict[str, Any]]) -> None:
        for n in rows:
            nodes[n["path"]] = Node(n["path"], float(n["weight"]), int(n["priority"]), n["kind"] == "tenant")
            walk(n["children"])

    walk(r.json()["tree"])
    return nodes


def expected_shares(nodes: Mapping[str, Node], backlogged_tenants: set[str]) -> dict[str, float]:
    """Each backlogged tenant's share by the tree (see the module's docstring); 0 for those at a worse level."""
    if not backlogged_tenants:
        return {}
    best = min(nodes[t].priority for t in backlogged_tenants)
    served = {t for t in backlogged_tenants if nodes[t].priority == best}
    active = served | {g for t in served for g in parents(t)}  # nodes with a served tenant below them
    weight_of: dict[str, float] = {}  # parent path ("" at the top) -> Σ w of its active children
    for path in active:
        parent = path.rpartition("/")[0]
        weight_of[parent] = weight_of.get(parent, 0.0) + nodes[path].weight
    out = dict.fromkeys(backlogged_tenants, 0.0)
    for t in served:
        share = 1.0
        for path in (t, *parents(t)):
            share *= nodes[path].weight / weight_of[path.rpartition("/")[0]]
        out[t] = share
    return out


@dataclass(frozen=True, slots=True)
class TreeScore:
    node: str
    expected: float
    measured: float

    def row(self) -> dict[str, Any]:
        return {"node": self.node, "expected": round(self.expected, 4), "measured": round(self.measured, 4)}


def tree_scores(
    records: Sequence[RequestRecord],
    duration_s: float,
    tenant_of: Mapping[str, str],
    nodes: Mapping[str, Node],
    step_s: float,
    w_p: float = 1.0,
    w_q: float = 2.0,
) -> list[TreeScore]:
    """Every tenant's and group's expected and measured share of the service given to backlogged tenants, over the
    grid steps in which at least two tenants were backlogged (`tenant_of`: bench client -> tenant path)."""
    times = time_grid(duration_s, step_s)
    curves = service_curves(records, times, w_p, w_q)
    waiting = backlogged(records, times)
    tenants = sorted({tenant_of[c] for c in curves if c in tenant_of})
    if not tenants or len(times) < 2:
        return []
    gain = {t: np.zeros(len(times) - 1) for t in tenants}
    busy = {t: np.zeros(len(times), dtype=bool) for t in tenants}
    for client, curve in curves.items():
        t = tenant_of.get(client)
        if t is not None:
            gain[t] += np.diff(curve)
            busy[t] |= waiting[client]
    expected = dict.fromkeys(tenants, 0.0)
    measured = dict.fromkeys(tenants, 0.0)
    total = 0.0
    for i in range(len(times) - 1):
        now = {t for t in tenants if busy[t][i]}
        if len(now) < 2:
            continue
        step = sum(gain[t][i] for t in now)
        if step <= 0:
            continue
        total += step
        for t, share in expected_shares(nodes, now).items():
            expected[t] += share * step
            measured[t] += gain[t][i]
    if total <= 0:
        return []
    out: dict[str, list[float]] = {}
    for t in tenants:
        for path in (t, *parents(t)):
            e, m = out.setdefault(path, [0.0, 0.0])
            out[path] = [e + expected[t] / total, m + measured[t] / total]
    order = [p for p in nodes if p in out]
    return [TreeScore(p, out[p][0], out[p][1]) for p in order]


def format_tree_scores(scores: Sequence[TreeScore]) -> str:
    """The scores as a table, groups and tenants in tree order, indented."""
    if not scores:
        return "tenant tree: no stretch with two tenants backlogged to score"
    width = max(len(s.node) for s in scores) + 2 * max(s.node.count("/") for s in scores) + 2
    lines = [
        "shares of the service to backlogged tenants, against the tenant tree:",
        f"{'node':<{width}} {'expected':>9} {'measured':>9}",
    ]
    for s in scores:
        name = "  " * s.node.count("/") + s.node.rpartition("/")[2]
        lines.append(f"{name:<{width}} {s.expected:>9.3f} {s.measured:>9.3f}")
    return "\n".join(lines)
