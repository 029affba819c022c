"""The gateway's modules import one another without a circle, type-only imports (`if TYPE_CHECKING:`) included: a
part that needs a few things of another takes a small Protocol of them (as `fleet.Scheduler`, `prometheus.Scheduler`,
`quota_gate.HasQuotas`, `reload.Gateway` do), not the other's class."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fairserve.gateway

pytestmark = pytest.mark.unit

ROOT = Path(fairserve.gateway.__file__).parent


def imports() -> dict[str, set[str]]:
    """Module -> the gateway modules it imports (relative `from .x import` and absolute `fairserve.gateway.x`)."""
    names = {p.stem for p in ROOT.glob("*.py")} - {"__init__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        tree = ast.parse((ROOT / f"{name}.py").read_text())
        out: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:
                    out.add(node.module.split(".")[0])
                elif node.level == 1:
                    out.update(a.name for a in node.names)
                elif node.module and node.module.startswith("fairserve.gateway."):
                    out.add(node.module.split(".")[2])
        graph[name] = out & names
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph`, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_gateway_has_no_import_circle():
    assert circle(imports()) is None, " -> ".join(circle(imports()) or [])


def test_the_check_finds_a_circle():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None
