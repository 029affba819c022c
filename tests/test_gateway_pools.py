"""Model pools in the gateway's scheduler, without HTTP: a request goes only to a backend that serves its model, an
unknown model is refused, a full pool holds up no other pool (in either counter scope), per-model prices, and the
counter scopes (per_model: a ledger per pool; global: one account per tenant over the fleet)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from support.gateway import config

from fairserve.gateway.admission.footprint import Footprint
from fairserve.gateway.admission.scheduler import Scheduler
from fairserve.gateway.admission.ticket import Ending
from fairserve.gateway.dispatch.pools import UnknownModel
from fairserve.gateway.metrics.prometheus import GatewayMetrics
from fairserve.gateway.settings.config import build_config, load_config

pytestmark = pytest.mark.integration

A = {"url": "http://a", "max_inflight_requests": 1, "models": ["model-a", "lora-a"]}
B = {"url": "http://b", "max_inflight_requests": 1, "models": ["model-b"]}


def scheduler(*backends: dict, **kw) -> Scheduler:
    metrics = GatewayMetrics()
    s = Scheduler(config(list(backends), **kw), metrics)
    metrics.bind(s)
    return s


def test_requests_go_only_to_the_backends_of_their_model():
    async def go() -> None:
        s = scheduler({**A, "max_inflight_requests": 8}, {**B, "max_inflight_requests": 8})
        tickets = [s.new_ticket("alice", Footprint(5, 5), model=m) for m in ["model-a", "model-b", "lora-a"] * 3]
        for t in tickets:
            assert s.submit(t) is None
        assert [t.backend.url for t in tickets] == ["http://a", "http://b", "http://a"] * 3
        with pytest.raises(UnknownModel, match="'gpt-9' does not exist.*lora-a, model-a, model-b"):
            s.new_ticket("alice", Footprint(5, 5), model="gpt-9")

    asyncio.run(go())


def test_with_one_pool_the_backend_answers_for_a_model_it_does_not_list():
    async def go() -> None:
        s = scheduler({**A, "max_inflight_requests": 8}, {**A, "url": "http://a2"})
        t = s.new_ticket("alice", Footprint(5, 5), model="gpt-9")
        assert s.submit(t) is None and t.backend.url in ("http://a", "http://a2")

    asyncio.run(go())


@pytest.mark.parametrize("scope", ["per_model", "global"])
def test_a_full_pool_holds_up_no_other_pool(scope):
    async def go() -> None:
        s = scheduler(A, B, scope=scope)
        heavy = [s.new_ticket("alice", Footprint(5, 5), model="model-a") for _ in range(5)]
        for t in heavy:
            s.submit(t)
        assert [t.admitted.done() for t in heavy] == [True] + [False] * 4
        light = s.new_ticket("bob", Footprint(5, 5), model="model-b")
        s.submit(light)
        assert light.admitted.done() and light.backend.url == "http://b"  # past the four queued for model-a
        # the requests passed over are back in their order, charged nothing for being looked at
        assert s.view().tenants["alice"].queued == 4 and s.view().tenants["alice"].service == 5
        s.close(heavy[0], Ending("ok", 5, 5))
        assert heavy[1].admitted.done() and not heavy[2].admitted.done()
        # alice's own request for model-b is not held up by her queued model-a requests either
        mine = s.new_ticket("alice", Footprint(5, 5), model="model-b")
        s.submit(mine)
        s.close(light, Ending("ok", 5, 5))
        assert mine.admitted.done() and mine.backend.url == "http://b"
        assert len(s.pools.ledgers) == (2 if scope == "per_model" else 1)

    asyncio.run(go())


def test_per_model_scope_counts_each_pool_apart_and_global_counts_the_fleet():
    async def go(scope: str) -> tuple[float, float]:
        s = scheduler(A, B, scope=scope)
        t = s.new_ticket("alice", Footprint(100, 50), model="model-a")
        s.submit(t)
        s.close(t, Ending("ok", 100, 50))
        a, b = (s.pools.route(m).ledger for m in ("model-a", "model-b"))
        return a.service.get("alice", 0.0), b.service.get("alice", 0.0)

    assert asyncio.run(go("per_model")) == (200.0, 0.0)
    assert asyncio.run(go("global")) == (200.0, 200.0)  # one ledger


def test_per_model_prices():
    async def go() -> None:
        s = scheduler(A, B, scope="global", prices={"model-a": {"w_p": 4, "w_q": 8}})
        big, small = (
            s.new_ticket("alice", Footprint(10, 3), model="model-a"),
            s.new_ticket("bob", Footprint(10, 3), model="model-b"),
        )
        for t in (big, small):
            s.submit(t)
            s.output(t, 3)
            s.close(t, Ending("ok", 10, 3))
        service = s.view().tenants
        assert service["alice"].service == 4 * 10 + 8 * 3 and service["bob"].service == 10 + 2 * 3

    asyncio.run(go())


def test_the_admin_view_sums_the_pools():
    async def go() -> None:
        s = scheduler(A, B)
        for m in ("model-a", "model-b"):
            t = s.new_ticket("alice", Footprint(10, 0), model=m)
            s.submit(t)
            s.close(t, Ending("ok", 10, 0))
        assert s.view().tenants["alice"].service == 20
        tenants, _, counter_of = s.accounts()
        assert tenants["alice"].service == 20 and counter_of(tenants["alice"]) == 20
        s.set_weight("alice", 2)
        assert all(x.accounts["alice"].weight == 2 for x in s.pools.ledgers)

    asyncio.run(go())


def test_per_model_scope_with_shared_state_or_a_snapshot_is_refused():
    base = {"backends": [A], "tenants": [{"name": "t", "api_keys": ["k"]}]}
    with pytest.raises(ValueError, match='scope: "per_model" cannot be combined with state'):
        build_config({**base, "scope": "per_model", "state": "redis://127.0.0.1:1/0"})
    with pytest.raises(ValueError, match="cannot be combined with snapshot"):
        build_config({**base, "scope": "per_model", "snapshot": "x.json"})
    assert build_config({**base, "snapshot": "x.json"}).counter_scope == "global"
    assert build_config(base).counter_scope == "per_model"


def test_a_usage_log_that_cannot_be_opened_is_one_error_line(tmp_path):
    from fairserve.gateway import create_app

    with pytest.raises(ValueError, match=r"^usage_log: cannot open '.*/no/such/dir/u.jsonl' for appending: No such"):
        create_app(config([A], usage_log=str(tmp_path / "no/such/dir/u.jsonl")))


def test_the_usage_log_to_stdout(capsys):
    async def go() -> None:
        s = scheduler(A, usage_log="-")
        t = s.new_ticket("alice", Footprint(7, 3), request_id="r-1", model="model-a", kind="completions")
        s.submit(t)
        s.output(t, 3)
        s.close(t, Ending("ok", 7, 3))

    asyncio.run(go())
    line = json.loads(capsys.readouterr().out)
    assert line["request_id"] == "r-1" and line["model"] == "model-a" and line["outcome"] == "ok"
    assert (line["prompt_tokens"], line["output_tokens"], line["service"]) == (7, 3, 13.0)
    assert line["backend"] == "http://a" and line["ttft_s"] >= line["queue_wait_s"] >= 0


def test_the_multi_model_example_of_the_docs_loads_and_routes(tmp_path):
    """docs/gateway.md's copyable example (the TOML block after `<!-- example: models -->`), as a user would copy it."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "gateway.md").read_text()
    block = re.search(r"<!-- example: models -->\n```toml\n(.*?)```", text, re.S)
    assert block is not None
    path = tmp_path / "models.toml"
    path.write_text(block.group(1).replace("/var/log/fairserve/usage.jsonl", str(tmp_path / "usage.jsonl")))
    cfg = load_config(path)
    assert cfg.counter_scope == "global" and cfg.prices["llama-70b"].w_q == 16
    assert cfg.allowed_models() == {"free/alice": frozenset({"llama-8b"})}

    async def go() -> None:
        s = Scheduler(cfg, GatewayMetrics())
        s.backends[0].serves([{"id": "llama-8b"}, {"id": "sql-lora", "parent": "llama-8b"}])  # its /v1/models
        urls = {m: {b.url[-4:] for b in s.pools.route(m).backends} for m in ("llama-8b", "sql-lora", "llama-70b")}
        assert urls == {"llama-8b": {"8001", "8002"}, "sql-lora": {"8001"}, "llama-70b": {"8003"}}
        with pytest.raises(UnknownModel):
            s.pools.route("gpt-4o")
        s.usage.close()

    asyncio.run(go())


def test_tokenize_is_capped_in_concurrency_per_tenant():
    from fairserve.gateway.http.tokenize import Tokenize

    class Held:
        """An upstream whose answers wait until released."""

        def __init__(self) -> None:
            self.release = asyncio.Event()
            self.calls = 0

        async def post(self, url, path, body, headers):
            self.calls += 1
            await self.release.wait()
            release = self.release

            class Resp:
                status_code = 200

                async def read(self) -> bytes:
                    assert release.is_set()
                    return b'{"count": 1}'

                def close(self) -> None:
                    pass

                def header(self, name):
                    return b"application/json"

            return Resp()

    async def go() -> None:
        s = scheduler(A, tokenize_concurrency=2)
        up = Held()
        tok = Tokenize(s, up, dict)
        body = json.dumps({"model": "model-a", "prompt": "hi"}).encode()
        held = [asyncio.create_task(tok._forward("/tokenize", body, "alice", f"r{i}")) for i in range(2)]
        while up.calls < 2:
            await asyncio.sleep(0.001)
        over = await tok._forward("/tokenize", body, "alice", "r3")
        other = asyncio.create_task(tok._forward("/tokenize", body, "bob", "r4"))  # another tenant's cap
        assert over.status_code == 429 and b"too_many_requests" in over.body and over.headers["retry-after"] == "1"
        up.release.set()
        assert [r.status_code for r in await asyncio.gather(*held, other)] == [200, 200, 200]
        assert tok.in_flight == {} and s.ledger.num_queued == 0 and s.view().tenants["alice"].service == 0

    asyncio.run(go())


def test_a_pass_stops_once_the_pools_with_room_have_nothing_queued():
    """One ledger over the fleet: after model B's only queued request is admitted, the pass does not walk model A's
    whole backlog looking for more (each request looked at is popped and put back: per-event work)."""

    async def go() -> None:
        s = scheduler(A, {**B, "max_inflight_requests": 8}, scope="global")
        for _ in range(50):
            s.submit(s.new_ticket("alice", Footprint(5, 5), model="model-a"))
        ledger = s.pools.ledgers[0]
        looked = []
        unpop = ledger.unpop
        ledger.unpop = lambda req, item=None: looked.append(req) or unpop(req, item)  # type: ignore[method-assign]
        light = s.new_ticket("bob", Footprint(5, 5), model="model-b")
        s.submit(light)
        assert light.admitted.done() and len(looked) <= 2, len(looked)

    asyncio.run(go())


def test_with_shared_state_a_request_defers_only_to_waiting_heads_of_pools_sharing_a_backend():
    """The replicas' comparison per pool, without Redis (the sync is not started; its view set by hand): another
    replica waits with bob's head for backend a. Alice's request for model-b (backend b) goes; hers for model-a and
    for model-x (backends a and b) wait behind bob's. This replica's own waiting heads and lease demand are per pool."""

    async def go() -> None:
        a = {"url": "http://a", "max_inflight_requests": 1, "models": ["model-a", "model-x"]}
        b = {"url": "http://b", "max_inflight_requests": 4, "models": ["model-b", "model-x"]}
        s = scheduler(a, b, scope="global", state="redis://127.0.0.1:9/0")
        shared = s.shared
        assert shared is not None and shared.pools is s.pools
        shared.up = True  # NOTE: as after a sync: bob (counter 0) waits on another replica for backend a
        shared._starved = [(0.0, "bob", "http://a")]
        first = s.new_ticket("alice", Footprint(5, 5), model="model-b")
        s.submit(first)
        assert first.admitted.done() and s.ledger.accounts["alice"].counter > 0
        held = [s.new_ticket("alice", Footprint(5, 5), model=m) for m in ("model-a", "model-x")]
        for t in held:
            s.submit(t)
        assert not any(t.admitted.done() for t in held)
        other = s.new_ticket("alice", Footprint(5, 5), model="model-b")
        s.submit(other)
        assert other.admitted.done() and other.backend.url == "http://b"
        assert {h.key for h in shared.heads()} == {"http://a", "http://a http://b"}
        # bob's wait over: alice's model-a request takes a's slot; the next two for model-a find no room
        shared._starved = []
        s.dispatch()
        assert held[0].admitted.done() and held[1].admitted.done()
        for _ in range(2):
            s.submit(s.new_ticket("alice", Footprint(5, 5), model="model-a"))
        args, _, _ = shared._args()
        starved = json.loads(next(x for x in args if isinstance(x, str) and x.startswith("[")))
        assert starved == ["alice", "http://a"]  # waiting for backend a only, with its pool
        rows = {args[k]: args[k + 5] for k in range(len(args)) if args[k] in ("http://a", "http://b")}
        assert rows == {"http://a": 1 + 1, "http://b": 3}  # demand: a's own queue on a (its limit), none on b

    asyncio.run(go())
