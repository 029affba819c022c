"""One declaration per key (`fairserve.api.keys`): a config field gives its flag, its place in the live/restart
decision and its row in the docs' table, with no other edit; the docs' tables are the ones the fields make."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fairserve.api.keys import add_flags, flag_overrides, in_doc, key, reload_keys, table
from fairserve.gateway.cli import add_parser
from fairserve.gateway.component import ReloadError
from fairserve.gateway.settings import reload as reload_module
from fairserve.gateway.settings.config import GatewayConfig, build_config
from fairserve.serve.config import ServeConfig
from fairserve.tenancy import ServerConfig

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parent.parent / "docs"
BASE = {"backends": [{"url": "http://127.0.0.1:9"}], "tenants": [{"name": "a", "api_keys": ["k"]}]}


class WithTwoMore(GatewayConfig):
    """The gateway's keys and two throwaway ones, each declared once, as a new key would be."""

    throwaway_wait_s: float = key(1.5, help="how long the throwaway part waits", gt=0)
    throwaway_mode: str = key("a", help="what the throwaway part does", metavar="MODE", restart="read at start")


@pytest.mark.parametrize(
    ("page", "model", "reloads"), [("gateway.md", GatewayConfig, True), ("engines.md", ServeConfig, False)]
)
def test_the_docs_tables_are_the_ones_the_fields_make(page, model, reloads):
    text = (DOCS / page).read_text()
    assert in_doc(text, model, reloads) == text, f"docs/{page} is out of date: run scripts/config_tables.py"


def test_a_new_key_is_one_field_its_flag_reload_decision_and_docs_row_follow():
    parser = argparse.ArgumentParser()
    add_flags(parser, WithTwoMore)
    args = parser.parse_args(["--throwaway-wait", "2.5", "--throwaway-mode", "b", "--queue-ttl", "9"])
    assert flag_overrides(args, WithTwoMore) == {"throwaway_wait_s": 2.5, "throwaway_mode": "b", "queue_ttl_s": 9.0}
    assert "how long the throwaway part waits (default 1.5)" in parser.format_help()

    live, restart = reload_keys(WithTwoMore)
    assert "throwaway_wait_s" in live and restart["throwaway_mode"] == "read at start"
    gateway_live, gateway_restart = reload_keys(GatewayConfig)
    assert (live - {"throwaway_wait_s"}, restart.keys() - {"throwaway_mode"}) == (gateway_live, gateway_restart.keys())
    assert gateway_restart["listen"] == "the socket is bound at start" and "tenants" in gateway_live

    rows = table(WithTwoMore).splitlines()
    assert "| `throwaway_wait_s` | `--throwaway-wait S` | 1.5 | how long the throwaway part waits |" in rows
    mode = "`--throwaway-mode MODE` | `a` | what the throwaway part does (restart only: read at start) |"
    assert f"| `throwaway_mode` | {mode}" in rows
    assert len(rows) == len(table(GatewayConfig).splitlines()) + 2

    class Stub:  # what a reload's first phase reads of the gateway
        reloading = None

        def __init__(self, cfg):
            self.cfg = cfg

        def parts(self):
            return []

    old = WithTwoMore(**BASE)
    reload_module.check(Stub(old), WithTwoMore(**BASE, throwaway_wait_s=3.0))  # live: accepted
    with pytest.raises(ReloadError, match="throwaway_mode changed: only a restart applies that \\(read at start\\)"):
        reload_module.check(Stub(old), WithTwoMore(**BASE, throwaway_mode="b"))


def test_a_field_without_a_declaration_is_refused_naming_it():
    class Undeclared(GatewayConfig):
        sneaky: int = 1

    with pytest.raises(TypeError, match="Undeclared.sneaky: declare it with fairserve.api.keys.key"):
        reload_keys(Undeclared)


def test_every_flag_of_the_command_line_reaches_its_key():
    parser = argparse.ArgumentParser()
    gateway = add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["gateway", "--backend", "http://127.0.0.1:9,max_requests=3", "--tenant", "org/a:k:2", "--group", "org:4:1"]
        + ["--model", "m1", "--model", "m2", "--no-access-log", "--trusted-proxy", "--state-ttl", "7"]
        + ["--client-buffer-bytes", "0", "--scope", "global", "--alias", "gpt-4o=m1"]
        + ["--fallback", "m1=m2|m3"]
    )
    cfg = build_config(flag_overrides(args, GatewayConfig))
    assert cfg.backends[0].max_inflight_requests == 3 and cfg.tenants[0].weight == 2.0
    assert (cfg.groups[0].weight, cfg.groups[0].priority, cfg.models) == (4.0, 1, ["m1", "m2"])
    assert (cfg.access_log, cfg.trusted_proxy, cfg.state_ttl_s, cfg.client_buffer_bytes) == (False, True, 7.0, 0)
    assert cfg.scope == "global" and cfg.aliases == {"gpt-4o": "m1"} and cfg.fallbacks == {"m1": ["m2", "m3"]}
    flags = {s for a in gateway._actions for s in a.option_strings}
    # NOTE: every key has a flag but the table of prices by model
    missing = [
        k
        for k in GatewayConfig.model_fields
        if k != "prices" and f"--{k.removesuffix('_s').replace('_', '-')}" not in flags
    ]
    assert sorted(missing) == [
        "aliases",
        "backends",
        "fallbacks",
        "groups",
        "models",
        "tenants",
    ]  # --backend, ...


def test_the_tenants_key_is_declared_once_and_none_means_keyless():
    # NOTE: one declaration (tenancy.ServerConfig) serves both commands; with none, both serve one tenant, keyless
    assert "tenants" in ServerConfig.__annotations__
    assert "tenants" not in GatewayConfig.__annotations__ and "tenants" not in ServeConfig.__annotations__
    keyless = build_config({"backends": BASE["backends"]})
    assert keyless.keyless and [t.name for t in keyless.tenants] == ["anonymous"]
    assert not build_config(BASE).keyless
    assert ServeConfig().tenants == []
