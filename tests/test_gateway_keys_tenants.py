"""Tenants made through the keys API, in one gateway in-process (Starlette's TestClient), kept beside the snapshot
file: `POST /admin/keys` with `new_tenant` makes the tenant and its first key at once, with its weight, priority and
rate cap in place when the answer comes; it is listed, survives a reload of the file and a restart, and goes with its
last key; the file wins over it, a file that clashes with it is refused, and bad input gets one clear error. A key's
own budget (a quota of its own) is enforced beside its tenant's. Integration tier: the app's lifespan runs the
gateway's parts. The snapshot keeps a made tenant's counter and weight; a key asked for a made tenant as its last key
is revoked gets 404, not a key that never serves."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI
from starlette.testclient import TestClient
from support.gateway import ADMIN, HTTP, KEYS, FakeBackend, config, serve

from fairserve.gateway import create_app
from fairserve.gateway.instance import Gateway
from fairserve.gateway.keys.book import Refused

pytestmark = pytest.mark.integration

BACKEND = "http://127.0.0.1:9"  # refuses at once: `/v1/models` answers the configured models
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
CAROL = {"weight": 3, "priority": 1, "rate": {"requests": 2}}
BUDGET = {"per": "day", "tokens": 40}


def cfg(tmp_path, **kw):
    return config([BACKEND], snapshot=str(tmp_path / "snap.json"), snapshot_interval_s=0, **kw)


@contextlib.contextmanager
def gateway(c) -> Iterator[tuple[TestClient, Gateway]]:
    app = create_app(c)
    with TestClient(app) as client:
        yield client, app.state.gateway


def post(client: TestClient, **body):
    return client.post("/admin/keys", json=body, headers=AS_ADMIN)


def owner(client: TestClient, key: str) -> str | None:
    return client.post("/admin/owners", json={"keys": [key]}, headers=AS_ADMIN).json()["owners"][key]


def made(client: TestClient) -> dict[str, dict]:
    """The tenants the API made, as `GET /admin/keys` lists them."""
    return {t["name"]: t for t in client.get("/admin/keys", headers=AS_ADMIN).json()["tenants"]}


def in_place(gw: Gateway, name: str) -> tuple[float, int, dict | None] | None:
    """The tenant's weight, priority and rate cap in the running gateway (None: not one of its tenants)."""
    if name not in gw.sched.tenants:
        return None
    caps = gw.cfg.index().rates
    return gw.cfg.weights()[name], gw.cfg.level_of(name), caps[name].model_dump() if name in caps else None


def test_a_key_with_new_tenant_makes_the_tenant_at_once_and_it_goes_with_its_last_key(tmp_path):
    with gateway(cfg(tmp_path)) as (client, gw):
        assert in_place(gw, "carol") is None
        r = post(client, tenant="carol", name="first", new_tenant=CAROL)
        assert r.status_code == 201, r.text
        first = r.json()
        # in place when the answer comes: the key serves, the weight, priority and cap are the gateway's
        assert owner(client, first["key"]) == "carol"
        assert in_place(gw, "carol") == (3.0, 1, {"requests": 2, "tokens": None})
        assert gw.sched.ledger.weights["carol"] == 3.0  # the ledger charges it so
        assert "carol" in client.get("/admin/rates", headers=AS_ADMIN).json()["rates"]
        assert made(client) == {"carol": {"name": "carol", **CAROL, "keys": 1}}
        # a second key of the tenant is made without new_tenant; with it, the tenant exists
        r = post(client, tenant="carol", new_tenant={})
        assert r.status_code == 409 and r.json()["error"]["code"] == "tenant_exists"
        second = post(client, tenant="carol").json()
        assert owner(client, second["key"]) == "carol" and made(client)["carol"]["keys"] == 2

        assert client.delete(f"/admin/keys/{first['id']}", headers=AS_ADMIN).status_code == 200
        assert in_place(gw, "carol") is not None and owner(client, second["key"]) == "carol"  # one key left
        assert client.delete(f"/admin/keys/{second['id']}", headers=AS_ADMIN).status_code == 200
        assert in_place(gw, "carol") is None and made(client) == {}  # gone with its last key
        r = post(client, tenant="carol")
        assert r.status_code == 404 and "give new_tenant to make it" in r.json()["error"]["message"]
    stored = json.loads((tmp_path / "snap.json.keys").read_text())
    assert stored["tenants"] == {} and stored["keys"] == {}


def test_a_restart_and_a_reload_keep_it_and_the_file_wins(tmp_path):
    with gateway(cfg(tmp_path)) as (client, gw):
        key = post(client, tenant="team/carol", new_tenant={"weight": 2}).json()["key"]
        assert in_place(gw, "team/carol") == (2.0, 0, None)
    with gateway(cfg(tmp_path)) as (client, gw):  # a restart: read from SNAPSHOT.keys, applied at start
        assert owner(client, key) == "team/carol" and in_place(gw, "team/carol") == (2.0, 0, None)
        gw.load = lambda: cfg(tmp_path, tenants=[{"name": "alice", "api_keys": ["key-alice-2"]}])
        assert client.post("/admin/reload", headers=AS_ADMIN).status_code == 200
        assert owner(client, key) == "team/carol" and in_place(gw, "alice") is not None  # the file's and the API's
        assert in_place(gw, "bob") is None
        # the file names team/carol: the file's weight, and the API's key serves as one of its keys
        gw.load = lambda: cfg(tmp_path, tenants=[{"name": "team/carol", "api_keys": ["k"], "weight": 5}])
        assert client.post("/admin/reload", headers=AS_ADMIN).status_code == 200
        assert in_place(gw, "team/carol") == (5.0, 0, None) and owner(client, key) == "team/carol"
        # a file whose tenants clash with it (team/carol a group) is refused, naming it; the running one is kept
        gw.load = lambda: cfg(tmp_path, tenants=[{"name": "team", "api_keys": ["k"]}])
        r = client.post("/admin/reload", headers=AS_ADMIN)
        assert (
            r.status_code == 400 and "tenants made through the keys API: 'team/carol'" in r.json()["error"]["message"]
        )
        assert in_place(gw, "team/carol") == (5.0, 0, None)
        # back to a file without it: the API's tenant again
        gw.load = lambda: cfg(tmp_path)
        assert client.post("/admin/reload", headers=AS_ADMIN).status_code == 200
        assert in_place(gw, "team/carol") == (2.0, 0, None) and owner(client, key) == "team/carol"


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"tenant": "carol", "new_tenant": 3}, 400, "invalid_request", "new_tenant"),
        ({"tenant": "carol", "new_tenant": {"weight": -1}}, 400, "invalid_request", "new_tenant"),
        ({"tenant": "carol", "new_tenant": {"api_keys": ["k"]}}, 400, "invalid_request", "new_tenant"),
        ({"tenant": "carol", "new_tenant": {"rate": {}}}, 400, "invalid_request", "new_tenant"),
        ({"tenant": "a//b", "new_tenant": {}}, 400, "invalid_request", "new_tenant"),
        ({"tenant": "alice", "new_tenant": {}}, 409, "tenant_exists", "new_tenant"),
        ({"tenant": "alice/x", "new_tenant": {}}, 409, "invalid_tenant", "tenant"),
    ],
)
def test_bad_new_tenants_get_one_clear_error_and_make_nothing(tmp_path, body, status, code, param):
    with gateway(cfg(tmp_path)) as (client, gw):
        r = post(client, **body)
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        assert r.json()["error"]["param"] == param and "\n" not in r.json()["error"]["message"]
        assert made(client) == {} and client.get("/admin/keys", headers=AS_ADMIN).json()["keys"] == []
        assert sorted(gw.sched.tenants) == ["alice", "bob"]


def test_a_keys_budget_is_its_own_quota_beside_its_tenants(tmp_path):
    """Through the official client: a key made with `budget = {tokens: 40, per: day}` is served until its requests
    have used 40 tokens, then gets 429 `insufficient_quota` naming the key (Retry-After: the day's end), while the
    tenant's other keys are served on (the negative control); a restart keeps the budget and its use is listed."""
    fake = FakeBackend()
    with serve(fake, snapshot=str(tmp_path / "snap.json"), snapshot_interval_s=0) as base:
        r = HTTP.post(base + "/admin/keys", json={"tenant": "alice", "budget": BUDGET}, headers=AS_ADMIN)
        assert r.status_code == 201, r.text
        made = r.json()
        assert made["budget"] == BUDGET
        capped = OpenAI(base_url=base + "/v1", api_key=made["key"], max_retries=0)
        served = 0
        with pytest.raises(openai.RateLimitError) as refused:
            for _ in range(20):  # each request: its prompt and 5 output tokens (more than 40 within 20)
                capped.completions.create(model="m", prompt="hello there", max_tokens=5)
                served += 1
        assert 1 <= served < 20 and refused.value.code == "insufficient_quota"
        assert f"key:{made['id']}" in refused.value.message and int(refused.value.response.headers["retry-after"]) >= 1
        other = OpenAI(base_url=base + "/v1", api_key=KEYS["alice"], max_retries=0)
        assert other.completions.create(model="m", prompt="hi", max_tokens=5).usage.completion_tokens == 5
        use = HTTP.get(base + "/admin/quotas", headers=AS_ADMIN).json()["quotas"][f"key:{made['id']}"]
        assert use["tokens"]["limit"] == 40 and use["tokens"]["used"] >= 40 - 5
    with serve(fake, snapshot=str(tmp_path / "snap.json"), snapshot_interval_s=0) as base:  # a restart keeps it
        rows = HTTP.get(base + "/admin/keys", headers=AS_ADMIN).json()["keys"]
        assert [row["budget"] for row in rows] == [BUDGET]
        assert f"key:{made['id']}" in HTTP.get(base + "/admin/quotas", headers=AS_ADMIN).json()["quotas"]


@pytest.mark.parametrize(
    "budget", [{"tokens": 5}, {"per": "day"}, {"tokens": -1, "per": "day"}, {"tokens": 5, "per": "week"}, "x"]
)
def test_a_bad_budget_is_one_clear_error(tmp_path, budget):
    with gateway(cfg(tmp_path)) as (client, _):
        r = post(client, tenant="alice", budget=budget)
        assert r.status_code == 400 and r.json()["error"]["param"] == "budget", r.text
        assert "\n" not in r.json()["error"]["message"]


def test_the_snapshot_keeps_a_made_tenants_counter_and_weight(tmp_path):
    with gateway(cfg(tmp_path)) as (client, gw):
        assert post(client, tenant="carol", new_tenant={"weight": 2}).status_code == 201
        assert client.put("/admin/tenants/carol/weight", json={"weight": 7}, headers=AS_ADMIN).status_code == 200
    stored = json.loads((tmp_path / "snap.json").read_text())["tenants"]
    assert stored["carol"]["weight"] == 7 and stored["carol"]["configured_weight"] == 2
    with gateway(cfg(tmp_path)) as (client, gw):  # restored with the file's tenants and the API's
        assert gw.sched.ledger.weights["carol"] == 7.0 and in_place(gw, "carol") == (2.0, 0, None)


def test_a_key_asked_for_a_made_tenant_as_its_last_key_is_revoked_gets_404_not_a_dead_key(tmp_path):
    async def go() -> None:
        gw = Gateway(cfg(tmp_path))
        await gw.serve()
        try:
            first = await gw.keys.create(json.dumps({"tenant": "carol", "new_tenant": {}}).encode())
            revoked, second = await asyncio.gather(
                gw.keys.revoke(first["id"]),
                gw.keys.create(json.dumps({"tenant": "carol"}).encode()),
                return_exceptions=True,
            )
            assert revoked == {"id": first["id"], "revoked": True}
            assert isinstance(second, Refused) and second.status == 404 and second.code == "unknown_tenant"
            assert "carol" not in gw.keys.tenants and gw.keys.book.records == {}
        finally:
            await gw.close()

    asyncio.run(go())
