"""The tenant tree as the dashboard, `fairserve top` and `fairserve bench` show it: the tree JSON, the expected
shares of backlogged tenants, and bench's scores against a gateway with groups."""

from __future__ import annotations

import json
import re

import pytest
from support.gateway import ADMIN, HTTP, FakeBackend, serve

from fairserve.bench.tree import Node, expected_shares
from fairserve.cli import main
from fairserve.core import Ledger, make_policy
from fairserve.dashboard import tree

pytestmark = pytest.mark.integration

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


def nodes(weights: dict[str, float], priorities: dict[str, int] | None = None, tenants=()) -> dict[str, Node]:
    prio = priorities or {}

    def level(path: str) -> int:
        parts = path.split("/")
        for k in range(len(parts), 0, -1):
            if "/".join(parts[:k]) in prio:
                return prio["/".join(parts[:k])]
        return 0

    groups = {"/".join(t.split("/")[:k]) for t in tenants for k in range(1, t.count("/") + 1)}
    paths = set(weights) | set(tenants) | groups
    return {p: Node(p, weights.get(p, 1.0), level(p), p in tenants) for p in paths}


def test_expected_share_is_the_product_of_weights_over_backlogged_siblings():
    leaves = ("a/x", "a/y", "a/z", "b/solo", "c/one")
    tree_ = nodes({"a": 3, "b": 1, "c": 1, "a/x": 2}, tenants=leaves)
    assert expected_shares(tree_, {"a/x", "a/y", "b/solo"}) == pytest.approx(
        {"a/x": 0.75 * 2 / 3, "a/y": 0.75 / 3, "b/solo": 0.25}
    )  # c and a/z are not backlogged: they take nothing from their siblings
    assert expected_shares(tree_, {"a/y", "a/z", "c/one"}) == pytest.approx({"a/y": 0.375, "a/z": 0.375, "c/one": 0.25})
    assert expected_shares(tree_, set()) == {}


def test_only_the_best_backlogged_priority_level_is_served():
    leaves = ("premium/p", "free/f1", "free/f2")
    tree_ = nodes({}, {"premium": 0, "free": 1}, tenants=leaves)
    assert expected_shares(tree_, {"premium/p", "free/f1"}) == {"premium/p": 1.0, "free/f1": 0.0}
    assert expected_shares(tree_, {"free/f1", "free/f2"}) == pytest.approx({"free/f1": 0.5, "free/f2": 0.5})


def test_the_tree_json_nests_nodes_with_shares_of_their_siblings():
    led = Ledger(make_policy("vtc"), ["t/o1/a", "t/o1/b", "t/o2/c"], {"t/o1": 2}, priorities={"t": 1})
    for i, (tenant, n) in enumerate([("t/o1/a", 10), ("t/o1/b", 30), ("t/o2/c", 40)]):
        req = led.arrive(i, tenant, n)
        led.pop()
        led.settle(req, prompt=n, output=0)
    (top,) = tree(led.view(), ["t/o1/a", "t/o1/b", "t/o2/c"])
    assert (top["path"], top["kind"], top["priority"], top["service"], top["share"]) == ("t", "group", 1, 80, 1.0)
    o1, o2 = top["children"]
    assert (o1["name"], o1["weight"], o1["share"], o2["share"]) == ("o1", 2, 0.5, 0.5)
    assert [(c["path"], c["kind"], c["share"]) for c in o1["children"]] == [
        ("t/o1/a", "tenant", 0.25),
        ("t/o1/b", "tenant", 0.75),
    ]
    assert o2["children"][0]["priority"] == 1  # its group's
    # with rates the share is of the rates now
    rated = tree(led.view(), ["t/o1/a", "t/o1/b", "t/o2/c"], {"t/o1": 1.0, "t/o2": 3.0, "t": 4.0})
    assert [c["share"] for c in rated[0]["children"]] == [0.25, 0.75]


TREE = {
    "tenants": [
        {"name": "org-a/u0", "api_keys": ["ka0"]},
        {"name": "org-a/u1", "api_keys": ["ka1"]},
        {"name": "org-b/solo", "api_keys": ["kb"]},
    ],
    "groups": [{"name": "org-a", "weight": 1}],
}


def test_top_and_bench_show_the_tree_and_score_it(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    clients = ["c0", "c2", "c1", "c2"]  # org-b's one client sends what org-a's two send together
    rows = [f"{i * 0.001:.3f},{clients[i % 4]},12,6" for i in range(60)]  # all at once: everybody backlogged
    trace.write_text("arrival_time_s,client,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "bench.json"
    with serve(FakeBackend(delay_s=0.003), backend_options={"max_inflight_requests": 1}, **TREE) as base:
        argv = ["bench", "--target", base, "--trace", str(trace), "--keys", "c0=ka0,c1=ka1,c2=kb", "--json", str(out)]
        assert main([*argv, "--admin-key", ADMIN, "--no-progress"]) == 0
        text = capsys.readouterr().out
        assert "against the tenant tree" in text
        shares = {r["node"]: r for r in json.loads(out.read_text())["summary"]["tree_shares"]}
        assert shares["org-a"]["expected"] == pytest.approx(0.5, abs=0.05)  # both orgs backlogged almost throughout
        assert shares["org-a/u0"]["expected"] == pytest.approx(0.25, abs=0.05)
        for node in ("org-a", "org-b", "org-a/u0", "org-a/u1", "org-b/solo"):
            assert shares[node]["measured"] == pytest.approx(shares[node]["expected"], abs=0.08), shares
        (line,) = [x for x in text.splitlines() if x.strip().startswith("solo")]
        # NOTE: the table prints 3 decimals of the same shares: a value at a rounding boundary may print 1e-3 off
        assert [float(x) for x in re.findall(r"\d\.\d{3}", line)] == pytest.approx(
            [shares["org-b/solo"]["expected"], shares["org-b/solo"]["measured"]], abs=1.5e-3
        )

        HTTP.put(base + "/admin/nodes/org-a/weight", json={"weight": 3}, headers=ADMIN_H)
        assert main(["top", "--target", base, "--admin-key", ADMIN, "--once", "--interval", "0.6"]) == 0
        shown = capsys.readouterr().out
        assert "tenant tree" in shown
        (org_a,) = [x for x in shown.splitlines() if re.search(r"│ org-a/ ", x)]
        assert re.search(r"│\s+3 │\s+0 │", org_a), org_a  # its weight, live, and its priority
        assert re.search(r"│\s+u0\s+│", shown)  # a member, indented under it


def test_replicas_compare_two_tenants_where_their_paths_part():
    from fairserve.gateway.shared.heads import parting

    assert parting("a", "b") == ("a", "b")  # a flat list: the tenants themselves
    assert parting("x/y/z", "x/w") == ("x/y", "x/w")
    assert parting("x/y/z", "x/y/q") == ("x/y/z", "x/y/q")  # siblings
    assert parting("class-a/u0", "class-b/u1") == ("class-a", "class-b")
