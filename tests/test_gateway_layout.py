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


def modules() -> dict[str, Path]:
    """Every module of the gateway by its dotted name under it (`admission.scheduler`); a package by its own."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name:
            out[name] = path
    return out


def imports() -> dict[str, set[str]]:
    """Module -> the gateway modules it imports (relative `from .x import`, `from .. import y`, absolute
    `fairserve.gateway.x`), type-only imports included."""
    found = modules()
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                if node.level - 1 > len(package):
                    continue  # NOTE: above the gateway (fairserve.core, ...)
                base = package[: len(package) - node.level + 1]
            elif node.module and node.module.startswith("fairserve.gateway."):
                base = []
                node = ast.ImportFrom(node.module.removeprefix("fairserve.gateway."), node.names, 1)
            else:
                continue
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # NOTE: `from . import fleet` imports a module; `from .x import y` names in x
                out.add(f"{target}.{alias.name}".strip(".") if f"{target}.{alias.name}".strip(".") in found else target)
        graph[name] = {m for m in out if m in found and m != name}
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


def test_the_gateway_is_in_subpackages_by_role_with_no_file_over_400_lines():
    found = modules()
    flat = sorted(n for n in found if "." not in n and not found[n].name == "__init__.py")
    assert flat == ["cli", "component", "instance"], flat  # the command, the life cycle and the composition root
    long = {n: len(p.read_text().splitlines()) for n, p in found.items() if len(p.read_text().splitlines()) > 400}
    assert not long, long


def test_the_check_finds_a_circle():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None
