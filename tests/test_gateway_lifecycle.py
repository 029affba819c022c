"""The gateway's parts and their one life cycle (gateway/component.py): every part is in `Gateway.parts()`, the
gateway starts them in that order and stops them in reverse, and each part's own start and stop do their work (the
snapshot written at stop, the usage log closed, the clients to the backends closed last but the scheduler's)."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.gateway import config

from fairserve.gateway.instance import Gateway

pytestmark = pytest.mark.unit


def is_component(obj: object) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("check", "configure", "start", "stop"))


def made(tmp_path, **kw) -> Gateway:
    cfg = config(
        ["http://127.0.0.1:9"],
        snapshot=str(tmp_path / "snap.json"),
        snapshot_interval_s=0,
        usage_log=str(tmp_path / "usage.jsonl"),
        **kw,
    )
    return Gateway(cfg)


def test_every_part_of_the_gateway_is_in_its_start_order(tmp_path):
    gw = made(tmp_path)
    parts = gw.parts()
    held = [v for v in vars(gw).values() if is_component(v)]
    assert held and all(any(p is v for p in parts) for v in held), "a part the gateway holds is not in parts()"
    assert len({id(p) for p in parts}) == len(parts)
    assert all(is_component(p) for p in parts)
    # NOTE: the scheduler first (the shared state is joined before anything serves), the proxy last (stopped first)
    assert parts[0] is gw.sched and parts[-1] is gw.proxy


def test_parts_start_in_order_and_stop_in_reverse_doing_their_work(tmp_path):
    gw = made(tmp_path)
    calls: list[tuple[str, str]] = []

    def spy(part: object, step: str) -> None:
        real = getattr(part, step)

        async def recorded() -> None:
            calls.append((step, type(part).__name__))
            await real()

        setattr(part, step, recorded)

    names = [type(p).__name__ for p in gw.parts()]
    for p in gw.parts():
        spy(p, "start")
        spy(p, "stop")

    async def life() -> None:
        await gw.serve()
        assert not gw.client.is_closed and not (tmp_path / "snap.json").exists()
        await gw.close()

    asyncio.run(life())
    assert calls == [("start", n) for n in names] + [("stop", n) for n in reversed(names)]
    assert gw.client.is_closed  # the gateway's own stop, after the health and capacity monitors'
    assert json.loads((tmp_path / "snap.json").read_text())  # Snapshots.stop wrote the last state
    assert not gw.sched.usage.on  # the scheduler's stop, last: the usage log closed


def test_a_part_that_fails_to_start_stops_the_gateway_before_it_serves(tmp_path):
    gw = made(tmp_path)

    async def refuse() -> None:
        raise RuntimeError("cannot start")

    gw.health.start = refuse  # type: ignore[method-assign]
    started: list[str] = []

    async def capacity_start() -> None:
        started.append("capacity")

    gw.capacity.start = capacity_start  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="cannot start"):
        asyncio.run(gw.serve())
    assert started == []  # the parts after it were not started


def test_a_reload_with_tenants_ends_keyless_mode_and_one_without_starts_it():
    from fairserve.gateway.instance import Gateway
    from fairserve.gateway.settings.config import build_config

    backends = {"backends": [{"url": "http://a:1"}], "health_interval_s": 0}
    keyed = build_config({**backends, "tenants": [{"name": "x", "api_keys": ["k"]}]})
    gw = Gateway(build_config(backends))
    assert gw._tenant(None, None) == gw._tenant("any", None) == "anonymous"
    gw.configure(keyed)
    assert gw._tenant(None, None) is None and gw._tenant("any", None) is None and gw._tenant("k", None) == "x"
    gw.configure(build_config(backends))
    assert gw._tenant("k", None) == "anonymous"
