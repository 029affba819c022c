"""Configuration at scale (issue 51), without timing anything: the tenant checks in linear passes give the same
answers (every prefix of every path is a group, each refusal still names what is wrong); a live reload works out the
tree's change off the event loop (`reload.prepare`), so that putting it in place reads nothing per tenant (every
per-tenant derivation made to fail after `prepare`, and the reload still applies), sets in the scheduler's list of
names only those after the ones both files begin with, and finds the keys only a restart applies once per model; and
that change, applied reload after reload, leaves every ledger node at the levels, permissions and weights the latest
file gives and the scheduler's list as the file's names (Hypothesis, against the file itself). What runs on the
reload's thread makes no single call over the whole file or all tenants: tomllib's turning of line ends into LF and
the sets of names are made a piece at a time, with the same result (Hypothesis, against the call made whole)."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.gateway import ADMIN, config

from fairserve.api import config as files
from fairserve.api import keys
from fairserve.gateway.dispatch import fleet
from fairserve.gateway.instance import Gateway
from fairserve.gateway.metrics.prometheus import GatewayMetrics
from fairserve.gateway.settings import reload, retree
from fairserve.gateway.settings.config import GatewayConfig, build_config
from fairserve.tenancy import ServerConfig, index, key_digest
from fairserve.tenancy.config import TenantIndex, _groups_of

pytestmark = pytest.mark.unit


def test_every_prefix_of_every_path_is_a_group():
    paths = ["a/b/c/d", "a/b/x", "a/y", "q", "r/s", "a/b/c/e"]
    assert _groups_of(paths) == {"a", "a/b", "a/b/c", "r"}
    assert _groups_of(reversed(paths)) == {"a", "a/b", "a/b/c", "r"}  # whichever path comes first


@pytest.mark.parametrize(
    "tenants,groups,admin,words",
    [
        ([("a/b", "k1"), ("a", "k2")], [], None, "'a' is a tenant, so it cannot also be a group"),
        ([("a/b/c", "k1"), ("x/y", "k2"), ("a/b", "k3")], [], None, "'a/b' is a tenant"),
        ([("a/b", "k1")], ["a/b"], None, "'a/b' is a tenant, not a group"),
        ([("a/b", "k1")], ["z"], None, "'z' is no group"),
        ([("a/b", "k1"), ("a/c", "k2")], ["a", "a"], None, "group names must be unique"),
        ([("a", "k1"), ("b", "#k1")], [], None, "shared by tenants 'a' and 'b'"),  # #: given hashed
        ([("a", "#k1"), ("b", "k2")], [], "k1", "admin_key is also an API key of tenant 'a'"),
        ([("a", "k1"), ("b", "#k2")], [], "k1", "admin_key is also an API key of tenant 'a'"),
        ([("a", "k1"), ("b", "k1")], [], None, "shared by tenants 'a' and 'b'"),
    ],
)
def test_the_checks_still_refuse_what_they_refused(tenants, groups, admin, words):
    def table(name: str, key: str) -> dict[str, Any]:
        return {"name": name, **({"api_key_sha256": [key_digest(key[1:])]} if key[0] == "#" else {"api_keys": [key]})}

    data = {
        "backends": [{"url": "http://a:1"}],
        "tenants": [table(n, k) for n, k in tenants],
        "groups": [{"name": g} for g in groups],
        **({"admin_key": admin} if admin else {}),
    }
    with pytest.raises(ValueError, match=words):
        build_config(data)


def big(tenants: int, changed: int = 0, added: int = 0, skip: int | None = None) -> GatewayConfig:
    data = {
        "backends": [{"url": "http://a:1"}],
        "admin_key": ADMIN,
        "health_interval_s": 0,
        "groups": [{"name": f"g{i}", "weight": 2.0, "priority": i} for i in range(3)],
        "tenants": [
            {"name": f"g{i % 3}/o{i // 10}/u{i}", "api_keys": [f"k{i}"], "weight": 5.0 if i < changed else 1.0}
            for i in range(tenants + added)
            if i != skip
        ],
    }
    return build_config(data)


def test_a_reload_puts_the_new_tree_in_place_reading_nothing_per_tenant(monkeypatch):
    async def go() -> None:
        gw = Gateway(big(200))
        new = reload.prepare(gw, lambda: big(200, changed=3, added=2))

        def per_tenant(*_: Any) -> Any:
            raise AssertionError("O(tenants) work on the event loop")

        # NOTE: what `prepare` made is all the loop may read; none of these may run again
        for name in ("weights", "priorities", "allowed", "key_owners", "quotas", "allowed_models"):
            monkeypatch.setattr(ServerConfig, name, per_tenant)
        monkeypatch.setattr(TenantIndex, "__init__", per_tenant)
        monkeypatch.setattr(retree, "_plan", per_tenant)
        reload.check(gw, new)
        line = reload.apply(gw, new, fleet.plan(gw.sched, new.backends))
        assert "202 tenants (2 added, 0 removed), 3 weights changed" in line, line
        monkeypatch.undo()
        assert gw.owners.get("k201") == "g0/o20/u201" and "g0/o20/u201" in gw.tenant_names
        acct = gw.sched.ledger.accounts
        assert acct["g0/o0/u0"].weight == 5.0 and acct["g1/o0/u4"].weight == 1.0 and "g2/o20/u200" in acct
        assert gw.sched.tenants[-1] == "g0/o20/u201"

    asyncio.run(go())


def test_a_reload_sets_in_the_schedulers_list_only_the_names_after_those_both_files_begin_with():
    writes: list[tuple[slice, int]] = []

    class Watched(retree.Names):
        def __setitem__(self, at: Any, value: Any) -> None:
            writes.append((at, len(value)))
            super().__setitem__(at, value)

    async def go() -> None:
        gw = Gateway(big(200))
        gw.sched.tenants = watched = Watched(gw.cfg)
        for load, at, count in [
            (lambda: big(200, changed=3, added=2), 200, 2),  # two added at the end: those two
            (lambda: big(200, changed=3, added=2, skip=150), 150, 51),  # one removed: from there on
            (lambda: big(200, changed=3, added=2, skip=150), 201, 0),  # the same names: none
        ]:
            writes.clear()
            new = reload.prepare(gw, load)
            reload.check(gw, new)
            reload.apply(gw, new, fleet.plan(gw.sched, new.backends))
            assert writes == [(slice(at, None), count)]
            assert gw.sched.tenants is watched and watched == new.index().names

    asyncio.run(go())


def test_the_keys_only_a_restart_applies_are_found_once_per_model(monkeypatch):
    _, first = keys.reload_keys(GatewayConfig)
    monkeypatch.setattr(keys, "declared", lambda model: pytest.fail("the model's fields walked again"))
    live, restart = keys.reload_keys(GatewayConfig)
    assert restart == first and "listen" in restart and "tenants" in live
    restart.clear()  # NOTE: a copy each time: the next caller's is whole
    assert keys.reload_keys(GatewayConfig)[1] == first


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="\r\na", max_size=40), st.integers(1, 5))
def test_line_ends_turned_a_piece_at_a_time_are_as_turned_at_once(text, piece):
    with mock.patch.object(files, "PIECE", piece):
        got = files.Text(text).replace("\r\n", "\n")
    assert got == text.replace("\r\n", "\n") and type(got) is str
    assert files.Text(text).replace("a", "b", 1) == text.replace("a", "b", 1)  # any other call as str's


def test_a_file_with_crlf_line_ends_reads_as_it_did(tmp_path, monkeypatch):
    import tomllib

    text = "".join(f'[[tenants]]\r\nname = "u{i}"\r\napi_keys = ["k{i}"]\r\n' for i in range(40))
    (path := tmp_path / "gw.toml").write_bytes(text.encode())
    monkeypatch.setattr(files, "PIECE", 7)
    assert files.read_toml(path) == tomllib.loads(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 20), max_size=30), st.integers(1, 4))
def test_a_set_made_a_piece_at_a_time_is_the_set(items, piece):
    with mock.patch.object(index, "PIECE", piece):
        assert index.set_of(items) == set(items)
        tenants = [{"name": f"a/u{i}", "api_keys": [f"k{i}"]} for i in items]
        if len(set(items)) < len(items):  # NOTE: a name repeated across two pieces is still found
            with pytest.raises(ValueError, match="tenant names must be unique"):
                build_config({"backends": [{"url": "http://a:1"}], "tenants": tenants})


def test_a_plan_is_kept_for_its_old_configuration_only():
    old, new, other = big(20), big(20, changed=2), big(20, added=1)
    made = retree.plan(old, new)
    assert retree.plan(old, new) is made  # made once
    assert retree.plan(other, new) is not made and retree.plan(other, new).weights == [
        (f"g{i % 3}/o0/u{i}", 5.0) for i in range(2)
    ]


NAMES = [f"{g}/{o}/{u}" for g in ("p", "q") for o in ("a", "b") for u in ("x", "y")]
LEVELS = st.none() | st.integers(-2, 2)
TREE = st.fixed_dictionaries(
    {
        "tenants": st.lists(
            st.tuples(
                st.sampled_from(NAMES), LEVELS, st.lists(st.integers(-2, 2), max_size=2), st.sampled_from([1, 3])
            ),
            min_size=1,
            max_size=len(NAMES),
            unique_by=lambda t: t[0],
        ),
        "groups": st.dictionaries(st.sampled_from(["p", "q", "p/a", "p/b", "q/a", "q/b"]), st.tuples(LEVELS, LEVELS)),
    }
)


def tree_config(tree: dict[str, Any]) -> GatewayConfig:
    names = {n for n, *_ in tree["tenants"]}
    groups = {g for n in names for g in (n.split("/")[0], n.rsplit("/", 1)[0])}
    return config(
        ["http://a:1"],
        tenants=[
            {"name": n, "api_keys": [f"key-{n}"], "priority": p, "priorities": ps, "weight": w}
            for n, p, ps, w in tree["tenants"]
        ],
        groups=[
            {"name": g, **({"priority": p} if p is not None else {}), **({"weight": w + 3} if w is not None else {})}
            for g, (p, w) in tree["groups"].items()
            if g in groups
        ],
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TREE, min_size=2, max_size=4))
def test_reload_after_reload_every_node_is_as_the_latest_file_says(trees):
    from fairserve.gateway.admission.scheduler import Scheduler

    async def go() -> None:
        configs = [tree_config(t) for t in trees]
        metrics = GatewayMetrics()
        sched = Scheduler(configs[0], metrics)
        metrics.bind(sched)
        for before, cfg in zip(configs, configs[1:], strict=False):
            admin = next(iter(sched.ledger.accounts))
            sched.set_weight(admin, 7.0)  # the admin's weight: kept unless this file changed that node's
            sched.configure(cfg)
            assert sched.tenants == [t.name for t in cfg.tenants]
            priorities, allowed, weights, old = cfg.priorities(), cfg.allowed(), cfg.weights(), before.weights()
            for ledger in sched.pools.ledgers:
                assert {t.name for t in cfg.tenants} <= set(ledger.accounts)
                for path, node in [*ledger.groups.items(), *ledger.accounts.items()]:
                    assert node.priority == priorities.get(path), path
                    if path in ledger.accounts:
                        assert node.allowed == (frozenset(allowed[path]) if path in allowed else None), path
                    if path == admin and old.get(path) == weights.get(path):
                        assert node.weight == 7.0
                    elif path in weights:
                        assert node.weight == weights[path], path

    asyncio.run(go())
