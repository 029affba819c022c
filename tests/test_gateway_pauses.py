"""No collector pauses (issue 51, gateway/settings/pauses.py), without timing anything: `fairserve gateway` freezes
what it holds once started; a reload runs with no full collection, the middle generation collected in small passes
and a short thread switch interval, freezes what is alive once applied (not when refused), and restores these
settings either way; the configuration a reload replaces is freed by reference counts alone (a cycle in it would
never be freed once frozen), emptied a tenant at a time off the event loop (`ServerConfig.release`, its set of names
let go of before the names themselves); a file's arrays of tables are emptied once validated, the config's own
lists untouched."""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from support.gateway import ADMIN

from fairserve.api.config import load_config
from fairserve.gateway.instance import Gateway
from fairserve.gateway.settings import pauses, reload
from fairserve.gateway.settings.config import GatewayConfig, build_config
from fairserve.tenancy import TenantConfig

pytestmark = pytest.mark.unit


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector's settings as they were, and nothing left frozen, after the test."""
    thresholds, switch, enabled = gc.get_threshold(), sys.getswitchinterval(), gc.isenabled()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    sys.setswitchinterval(switch)
    if enabled:
        gc.enable()


def test_settle_freezes_what_is_alive(collector):
    gc.unfreeze()
    pauses.settle()
    assert gc.get_freeze_count() > 1000 and gc.get_count()[2] == 0


def test_a_reload_builds_with_no_full_collection_and_freezes_once_applied(collector):
    gc.unfreeze()
    thresholds, switch = gc.get_threshold(), sys.getswitchinterval()
    with pauses.building(True):
        assert gc.get_threshold() == (thresholds[0], min(thresholds[1], pauses.YOUNG), pauses.NEVER)
        assert sys.getswitchinterval() == pytest.approx(pauses.SWITCH_S)
        made = [[i] for i in range(5000)]
        assert gc.get_freeze_count() == 0
    assert gc.get_freeze_count() >= 5000 and gc.get_threshold() == thresholds
    assert sys.getswitchinterval() == switch
    del made
    gc.unfreeze()
    with pytest.raises(ValueError), pauses.building(True):
        raise ValueError("refused")
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds  # refused: nothing frozen
    with pauses.building(False):
        assert gc.get_threshold() == thresholds and sys.getswitchinterval() == switch
    assert gc.get_freeze_count() == 0


def tenants(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"name": f"g{i % 3}/u{i}", "api_keys": [f"k{i}"]} for i in range(start, start + n)]


def cfg(n: int, start: int = 0) -> GatewayConfig:
    data = {"backends": [{"url": "http://a:1"}], "admin_key": ADMIN, "health_interval_s": 0}
    return build_config({**data, "tenants": tenants(n, start)})


def test_a_replaced_configuration_is_freed_a_tenant_at_a_time_with_no_collection(collector):
    async def go() -> None:
        gw = Gateway(cfg(50))
        gw.frozen = True
        box = [cfg(60)]
        await reload.reload(gw, box.pop)  # NOTE: nothing but the gateway holds it once read
        held, their, index = weakref.ref(gw.cfg), gw.cfg.tenants, gw.cfg.index()
        assert len(their) == 60
        gc.disable()  # NOTE: freed by reference counts alone, or not at all
        await reload.reload(gw, lambda: cfg(70, start=5))
        # NOTE: the executor's thread lets go of its work item (the bound `release`) just after it wakes the loop;
        # joined here, or a loaded machine finds the old configuration still held for a moment
        await asyncio.get_running_loop().shutdown_default_executor()
        assert held() is None and their == []  # emptied (off the loop), then freed
        assert index.names == [] and index.name_set == frozenset()  # NOTE: the set let go of before its names
        assert gw.owners.get("k74") == "g2/u74" and gw.owners.get("k0") is None and len(gw.sched.tenants) == 70

    asyncio.run(go())


@pytest.mark.parametrize("made_by_api", [False, True])
def test_the_gateways_reload_frees_the_file_it_replaced_a_tenant_at_a_time(collector, made_by_api):
    """`Gateway.reload` keeps the file's configuration beside the one it runs (the keys API's tenants added to it):
    the file it replaces is emptied off the loop too, with or without such tenants."""

    async def go() -> None:
        gw = Gateway(cfg(50))
        gw.frozen = True
        if made_by_api:
            gw.keys.tenants = {"api/t": TenantConfig.model_validate({"name": "api/t", "api_keys": []})}
        gw.load = lambda: cfg(60)
        await gw.reload()
        assert ("api/t" in gw.sched.tenants) is made_by_api and (gw.cfg is gw.base) is not made_by_api
        held, their, running = weakref.ref(gw.base), gw.base.tenants, gw.cfg.tenants
        gc.disable()  # NOTE: freed by reference counts alone, or not at all
        gw.load = lambda: cfg(70, start=5)
        await gw.reload()
        await asyncio.get_running_loop().shutdown_default_executor()
        assert held() is None and their == [] and running == []  # emptied (off the loop), then freed
        assert len(gw.sched.tenants) == 70 + made_by_api

    asyncio.run(go())


def test_a_configuration_someone_else_holds_is_left_whole(collector):
    async def go() -> None:
        gw = Gateway(cfg(10))
        mid = cfg(12)
        await reload.reload(gw, lambda: mid)
        await reload.reload(gw, lambda: cfg(11))
        assert len(mid.tenants) == 12 and mid.index().names[-1] == "g2/u11"  # still held here: not emptied

    asyncio.run(go())


def test_a_files_tables_are_emptied_once_validated_not_the_configs_lists(tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text(
        'forwarded_allow_ips = ["10.0.0.1"]\n[[backends]]\nurl = "http://a:1"\n'
        '[[tenants]]\nname = "a"\napi_keys = ["k"]\n[[tenants]]\nname = "b"\napi_keys = ["j"]\n'
    )
    got = load_config(GatewayConfig, path)
    assert [t.name for t in got.tenants] == ["a", "b"] and got.forwarded_allow_ips == ["10.0.0.1"]
    assert got.backends[0].url.startswith("http://a:1")
    flags = {"tenants": [{"name": "c", "api_keys": ["x"]}]}
    assert [t.name for t in load_config(GatewayConfig, path, flags).tenants] == ["c"]
    assert flags["tenants"] == [{"name": "c", "api_keys": ["x"]}]  # a flag's list is the caller's: left as it is


def test_the_gateway_command_freezes_once_started(monkeypatch):
    import argparse

    import uvicorn

    from fairserve.api import server
    from fairserve.gateway import cli
    from fairserve.gateway.http import app

    seen: dict[str, Any] = {}
    made = app.create_app
    monkeypatch.setattr(app, "create_app", lambda *a, **kw: seen.update(kw) or made(*a, **kw))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    monkeypatch.setattr(server, "check_listen_free", lambda host, port: None)  # NOTE: no socket in this tier
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    flags = ["gateway", "--backend", "http://b:2", "--tenant", "t:k", "--listen", "127.0.0.1:1"]
    assert cli.run(parser.parse_args(flags)) == 0
    assert seen["freeze"] is True
