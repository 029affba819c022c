"""The backend set changing under the scheduler (gateway/dispatch/fleet.py), in-process: per_model ledgers follow their
models through a reload (counters carried over, none lost or counted twice where pools merge), a request that fails on a
removed backend is routed again, and a queued request whose model no backend serves any more gets a 404."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from support.gateway import ADMIN, FakeBackend, auth, chat_body, metric, wait_until

from fairserve.api.server import running_server
from fairserve.gateway import create_app, load_config
from fairserve.gateway.admission.footprint import Footprint
from fairserve.gateway.admission.scheduler import Scheduler
from fairserve.gateway.admission.ticket import Ending
from fairserve.gateway.dispatch.fleet import apply, plan
from fairserve.gateway.metrics.prometheus import GatewayMetrics
from fairserve.gateway.settings.config import build_config

pytestmark = pytest.mark.integration


def cfg(*backends: tuple[str, list[str], int]):
    return build_config(
        {
            "backends": [{"url": u, "models": m, "max_inflight_requests": n} for u, m, n in backends],
            "tenants": [{"name": "alice", "api_keys": ["ka"]}, {"name": "bob", "api_keys": ["kb"]}],
            "health_interval_s": 0,
        }
    )


A, B = "http://127.0.0.1:9", "http://127.0.0.1:10"  # never reached: nothing is sent upstream here


def reload(sched: Scheduler, new) -> list:
    unserved = apply(sched, plan(sched, new.backends))
    sched.cfg = new
    sched.dispatch()
    return unserved


def test_per_model_ledgers_follow_their_models_and_merged_pools_lose_no_charge():
    async def run() -> None:
        metrics = GatewayMetrics()
        sched = Scheduler(cfg((A, ["x"], 1), (B, ["y"], 1)), metrics)
        metrics.bind(sched)
        d = sched.pools

        def submit(tenant: str, model: str):
            t = sched.new_ticket(tenant, Footprint(10, 5), model=model)
            assert sched.submit(t) is None
            return t

        x1, y1 = submit("alice", "x"), submit("bob", "y")  # running on A, on B
        x2, y2 = submit("alice", "x"), submit("bob", "y")  # queued
        lx, ly = x1.pool.ledger, y1.pool.ledger
        assert lx is not ly and len(d.ledgers) == 2 and x1.admitted.result().url == A

        # B serves x too now: x's pool is {A, B}, made with x's ledger (alice's counter carries over)
        counter = lx.counter_of("alice")
        reload(sched, cfg((A, ["x"], 1), (B, ["x", "y"], 3)))
        assert len(d.ledgers) == 2 and x2.pool.ledger is lx and {b.url for b in x2.pool.backends} == {A, B}
        assert x2.admitted.result().url == B and lx.counter_of("alice") == counter + 10  # its prompt, in x's ledger

        # A removed: x and y both go to {B}, y's pool; x's queued request stays in x's ledger (a leftover pool)
        x3 = submit("alice", "x")
        assert not x3.admitted.done()
        reload(sched, cfg((B, ["x", "y"], 3)))
        assert x3.pool.ledger is lx and x3.pool is not d.route("x") and d.route("x").ledger is ly
        assert sched.draining == [x1.backend] and x1.backend.limit == 0
        text = metrics.exposition().decode()  # the two pools over B are one series, B's requests counted once
        assert 'pool_inflight_requests{pool="x,y"} 3.0' in text and 'pool_queue_length{pool="x,y"} 1.0' in text
        for t in (x1, y1, x2, y2):
            sched.close(t, Ending("ok", 10, 5))
        assert sched.draining == []  # A drained
        assert x3.admitted.result().url == B  # from its own ledger, on the merged pool's backend
        sched.close(x3, Ending("ok", 10, 5))
        # every request charged once, in the ledger it was queued in: 5 requests x (10 + 2 x 5)
        assert sum(x.service["alice"] + x.service["bob"] for x in d.ledgers) == 5 * 20
        assert lx.service["alice"] == 3 * 20 and ly.service["bob"] == 2 * 20
        assert sum(len(x) for x in d.ledgers) == 0

    asyncio.run(run())


def test_a_request_that_fails_on_a_removed_backend_is_routed_again():
    async def run() -> None:
        sched = Scheduler(cfg((A, ["x"], 1)), GatewayMetrics())
        t = sched.new_ticket("alice", Footprint(10, 5), model="x")
        assert sched.submit(t) is None and t.admitted.result().url == A
        reload(sched, cfg((B, ["x"], 1)))
        assert sched.backend_failed(t, lost=True)  # its connection broke before any output
        assert t.admitted.result().url == B and sched.draining == []

    asyncio.run(run())


def test_a_queued_request_whose_model_no_backend_serves_now_gets_404(tmp_path):
    slow, other, third = FakeBackend(delay_s=0.2), FakeBackend(), FakeBackend()  # slow: 0.6 s for 3 tokens
    path = tmp_path / "gateway.toml"

    def toml(*backends: tuple[str, str]) -> str:
        out = f'admin_key = "{ADMIN}"\nhealth_interval_s = 0\n'
        out += "".join(f'[[backends]]\nurl = "{u}"\nmodels = ["{m}"]\nmax_inflight_requests = 1\n' for u, m in backends)
        return out + '[[tenants]]\nname = "alice"\napi_keys = ["a"]\n'

    with running_server(slow.app) as s, running_server(other.app) as o, running_server(third.app) as t:
        path.write_text(toml((s, "fake-model"), (o, "other"), (t, "third")))
        with running_server(create_app(load_config(path), lambda: load_config(path))) as gw:

            async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
                async with httpx.AsyncClient(timeout=30) as c:

                    def post() -> asyncio.Future[httpx.Response]:
                        body = chat_body(3)
                        return asyncio.ensure_future(c.post(gw + "/v1/chat/completions", json=body, headers=auth("a")))

                    running = post()
                    assert await asyncio.to_thread(wait_until, lambda: slow.calls == 1)
                    waiting = post()
                    queued = lambda: metric(gw, "fairserve_gateway_queue_length", tenant="alice") == 1  # noqa: E731
                    assert await asyncio.to_thread(wait_until, queued)
                    path.write_text(toml((o, "other"), (t, "third")))
                    answer = await c.post(gw + "/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
                    gone = await waiting
                    assert not running.done()  # answered while the removed backend still runs the first
                    return answer, gone, await running

            answer, gone, ran = asyncio.run(scenario())
            assert "1 queued requests for models no backend serves now answered 404" in answer.json()["message"]
            assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
            assert ran.status_code == 200 and ran.json()["choices"][0]["message"]["content"] == " tok" * 3
