"""The core's shape, checked on its source: no import circle in `core/`, no driver that tests a policy's class
(capabilities say what a policy supports), one name for the party whose service is counted (tenant), and the ledger
the only writer: no module outside `core/` sets a field of an `Account` or patches a policy."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import fairserve
import fairserve.core
from fairserve.core import Account, Policy

pytestmark = pytest.mark.unit

SRC = Path(fairserve.__file__).parent
CORE = SRC / "core"
POLICY_CLASSES = {"Policy", "VTC", "LCF", "FCFS", "RPM", "DRR"}


def _core_imports(path: Path) -> set[str]:
    """The `core` modules `path` imports (relative imports only: the core imports nothing else of fairserve)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module)
            else:
                out.update(a.name for a in node.names)
    return out


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import circle in `graph` (module -> the modules it imports), or None."""
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> list[str] | None:
        if module in path:
            return [*path, module]
        if module in done:
            return None
        for dep in sorted(graph.get(module, ())):
            found = visit(dep, (*path, module))
            if found:
                return found
        done.add(module)
        return None

    return next((c for c in (visit(m, ()) for m in graph) if c), None)


def test_core_has_no_import_circle():
    graph = {p.stem: _core_imports(p) - {"__init__"} for p in CORE.glob("*.py") if p.stem != "__init__"}
    assert graph["account"] <= {"fairness"}  # the ground file
    assert circle(graph) is None, " -> ".join(circle(graph) or [])
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check finds one


def test_no_driver_tests_a_policy_class():
    offenders = []
    for path in SRC.rglob("*.py"):
        if CORE in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
                names = (
                    {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} if len(node.args) > 1 else set()
                )
                if names & POLICY_CLASSES:
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not offenders, f"use Policy.capabilities instead: {offenders}"


def test_the_core_says_tenant_not_client():
    # NOTE: `CLIENT=WEIGHT` is the public --weights syntax, and "the client" who cancels is the HTTP client
    allowed = re.compile(r"CLIENT=WEIGHT|by the client")
    found = []
    for path in CORE.glob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"client", allowed.sub("", line), re.IGNORECASE):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, found


def test_the_checks_would_catch_what_they_look_for(tmp_path):
    # the scans above are not vacuous: they find an import, an isinstance and a 'client' where there is one
    assert _core_imports(CORE / "ledger.py") >= {"account", "policy", "request"}
    snippet = ast.parse("isinstance(p, VTC)")
    call = next(n for n in ast.walk(snippet) if isinstance(n, ast.Call))
    assert {n.id for n in ast.walk(call.args[1]) if isinstance(n, ast.Name)} & POLICY_CLASSES
    assert re.search(r"client", "Request.client", re.IGNORECASE)


ACCOUNT_FIELDS = {f.name for f in dataclasses.fields(Account)}
# NOTE: other classes with a field of the same name, by the expression that writes it (the dispatch pool's and the
# metrics' queue counts, vLLM's own request, the simulator's budget): none of them is an `Account`
NOT_ACCOUNTS = {
    ("queued", "pool"),
    ("queued", "t.pool"),
    ("queued", "self.level(req.priority or 0)"),
    ("priority", "request"),
    ("running", "self"),
}
POLICY_METHODS = {n for n, v in vars(Policy).items() if callable(v) and not n.startswith("__")}


def _stores(tree: ast.AST) -> list[tuple[str, str, int]]:
    """(attribute, the expression it is set on, line) of every attribute assignment in `tree`."""
    out = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        out += [(e.attr, ast.unparse(e.value), e.lineno) for e in flat if isinstance(e, ast.Attribute)]
    return out


def _setattrs(tree: ast.AST) -> list[int]:
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("setattr", "delattr")
    ]


def test_no_module_outside_the_core_writes_an_account_or_patches_a_policy():
    accounts, patches = [], []
    for path in SRC.rglob("*.py"):
        if CORE in path.parents:
            continue
        tree = ast.parse(path.read_text())
        where = path.relative_to(SRC)
        for attr, on, line in _stores(tree):
            if attr in ACCOUNT_FIELDS and (attr, on) not in NOT_ACCOUNTS:
                accounts.append(f"{where}:{line}: {on}.{attr}")
            if attr in POLICY_METHODS:
                patches.append(f"{where}:{line}: {on}.{attr}")
        patches += [f"{where}:{line}: setattr" for line in _setattrs(tree)]
    assert not accounts, f"change a node through the ledger (Ledger.set_node) or keep a side table: {accounts}"
    assert not patches, f"observe the ledger through Ledger.listen, do not patch a policy: {patches}"


def test_the_account_and_policy_scans_find_what_they_look_for():
    snippet = ast.parse("acct.lift = None\nnode.priority, x = 1, 2\ng.service += 1\nsetattr(policy, 'enqueue', f)\n")
    assert {(a, on) for a, on, _ in _stores(snippet)} >= {("priority", "node"), ("service", "g"), ("lift", "acct")}
    assert _setattrs(snippet) == [4]
    assert {"enqueue", "on_charge", "dequeue", "remove"} <= POLICY_METHODS
    assert {"service", "counter", "weight", "priority", "allowed", "queued"} <= ACCOUNT_FIELDS
    # the core's data only: the replicas' sync state and DRR's round live in side tables
    assert not {"synced", "lift", "round"} & ACCOUNT_FIELDS
