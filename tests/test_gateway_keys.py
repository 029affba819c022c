"""Keys by API in one gateway, in-process (Starlette's TestClient), kept beside the snapshot file: a key made by
`POST /admin/keys` is answered once and serves at once; `GET /admin/keys` lists it without the key or its digest,
with its last use (per second, on an injected clock); a revoked or expired key gets 401 `invalid_api_key` while the
tenant's other keys still serve; a reload replaces the config file's keys and keeps the API's (a removed tenant's are
refused and listed orphaned); a restart keeps them; bad input gets one clear error. Integration tier: the app's
lifespan runs the gateway's parts (their loops sleep), and `/v1/models` tries the unreachable backend."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient
from support.gateway import ADMIN, KEYS, config

from fairserve.gateway import create_app
from fairserve.gateway.instance import Gateway
from fairserve.gateway.keys.gate import ApiKeys
from fairserve.tenancy import key_digest
from fairserve.tenancy.index import KeyOwners

pytestmark = pytest.mark.integration

T0 = 1_798_761_600.0  # 2027-01-01T00:00:00Z
BACKEND = "http://127.0.0.1:9"  # refuses at once: `/v1/models` answers the configured models
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def cfg(tmp_path, **kw):
    return config([BACKEND], snapshot=str(tmp_path / "snap.json"), snapshot_interval_s=0, **kw)


@contextlib.contextmanager
def gateway(c, clock: Clock) -> Iterator[tuple[TestClient, Gateway]]:
    app = create_app(c)
    gw = app.state.gateway
    gw.keys.book.clock = clock
    with TestClient(app) as client:
        yield client, gw


def make(client: TestClient, **body) -> dict:
    r = client.post("/admin/keys", json=body, headers=AS_ADMIN)
    assert r.status_code == 201, r.text
    return r.json()


def owner(client: TestClient, key: str) -> str | None:
    """Who the gateway says owns `key` (None: it would be refused)."""
    return client.post("/admin/owners", json={"keys": [key]}, headers=AS_ADMIN).json()["owners"][key]


def models(client: TestClient, key: str):
    return client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})


def listed(client: TestClient) -> dict[str, dict]:
    r = client.get("/admin/keys", headers=AS_ADMIN)
    assert r.status_code == 200, r.text
    return {row["id"]: row for row in r.json()["keys"]}


def test_a_key_made_by_api_serves_at_once_is_listed_without_it_and_is_refused_once_revoked(tmp_path):
    clock = Clock()
    with gateway(cfg(tmp_path), clock) as (client, _):
        ci = make(client, tenant="alice", name="ci")
        other = make(client, tenant="alice")
        key = ci["key"]
        assert key.startswith("fs-") and len(key) > 40 and ci["prefix"] == key[:8] and ci["tenant"] == "alice"
        assert ci["name"] == "ci" and ci["expires_at"] is None and ci["last_used_at"] is None
        assert owner(client, key) == "alice" and models(client, key).status_code == 200
        clock.now = T0 + 5.7
        assert models(client, other["key"]).status_code == 200

        r = client.get("/admin/keys", headers=AS_ADMIN)
        assert r.json()["store"] == "file"
        for secret in (key, key_digest(key), other["key"]):
            assert secret not in r.text  # never the key, nor its digest
        rows = listed(client)
        assert rows[ci["id"]]["last_used_at"] == "2027-01-01T00:00:00+00:00"
        assert rows[other["id"]]["last_used_at"] == "2027-01-01T00:00:05+00:00"
        assert rows[ci["id"]]["created_at"] == "2027-01-01T00:00:00+00:00" and not rows[ci["id"]]["orphaned"]
        stored = (tmp_path / "snap.json.keys").read_text()
        assert key_digest(key) in stored and key not in stored  # hashed at rest
        # a tenant's key (an API one too) is no admin key
        r = client.get("/admin/keys", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_admin"

        r = client.delete(f"/admin/keys/{ci['id']}", headers=AS_ADMIN)
        assert r.status_code == 200 and r.json() == {"id": ci["id"], "revoked": True}
        r = models(client, key)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert owner(client, key) is None
        # the negative control: the tenant's other keys still serve
        assert models(client, other["key"]).status_code == 200 and models(client, KEYS["alice"]).status_code == 200
        assert list(listed(client)) == [other["id"]]
        r = client.delete(f"/admin/keys/{ci['id']}", headers=AS_ADMIN)
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_key"


def test_an_expired_key_gets_401_saying_so_on_an_injected_clock(tmp_path):
    clock = Clock()
    with gateway(cfg(tmp_path), clock) as (client, _):
        soon = make(client, tenant="bob", expires_in_s=60)
        later = make(client, tenant="bob", expires_at="2027-01-02T00:00:00Z")
        assert soon["expires_at"] == "2027-01-01T00:01:00+00:00" and later["expires_at"] == "2027-01-02T00:00:00+00:00"
        clock.now = T0 + 59.9
        assert models(client, soon["key"]).status_code == 200
        clock.now = T0 + 60
        r = models(client, soon["key"])
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert "expired at 2027-01-01T00:01:00+00:00" in r.json()["error"]["message"]
        assert models(client, later["key"]).status_code == 200  # the other key of bob's still serves
        rows = listed(client)
        assert rows[soon["id"]]["expired"] and not rows[later["id"]]["expired"]  # listed until revoked


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (b"nope", 400, "invalid_request", "tenant"),
        (b"[]", 400, "invalid_request", "tenant"),
        (b'{"name": "x"}', 400, "invalid_request", "tenant"),
        (b'{"tenant": ""}', 400, "invalid_request", "tenant"),
        (b'{"tenant": "alice", "weight": 2}', 400, "invalid_request", "weight"),
        (b'{"tenant": "alice", "name": 3}', 400, "invalid_request", "name"),
        (b'{"tenant": "alice", "expires_in_s": 0}', 400, "invalid_expiry", "expires_in_s"),
        (b'{"tenant": "alice", "expires_in_s": true}', 400, "invalid_expiry", "expires_in_s"),
        (b'{"tenant": "alice", "expires_in_s": 1e300}', 400, "invalid_expiry", "expires_in_s"),
        (b'{"tenant": "alice", "expires_in_s": NaN}', 400, "invalid_expiry", "expires_in_s"),
        (b'{"tenant": "alice", "expires_at": "9999-12-31T23:59:59-12:00"}', 400, "invalid_expiry", "expires_at"),
        (b'{"tenant": "alice", "expires_at": "tomorrow"}', 400, "invalid_expiry", "expires_at"),
        (b'{"tenant": "alice", "expires_at": "2026-12-31T23:00:00Z"}', 400, "invalid_expiry", "expires_at"),
        (b'{"tenant": "alice", "expires_at": "2027-02-01", "expires_in_s": 5}', 400, "invalid_expiry", "expires_at"),
        (b'{"tenant": "carol"}', 404, "unknown_tenant", "tenant"),
    ],
)
def test_bad_input_gets_one_clear_error_and_makes_no_key(tmp_path, body, status, code, param):
    with gateway(cfg(tmp_path), Clock()) as (client, _):
        r = client.post("/admin/keys", content=body, headers=AS_ADMIN)
        assert r.status_code == status and r.json()["error"]["code"] == code and r.json()["error"]["param"] == param
        assert listed(client) == {}


def test_who_may_make_keys_and_where_none_can_be_kept(tmp_path):
    with gateway(cfg(tmp_path), Clock()) as (client, _):
        for headers, status in [({}, 401), ({"Authorization": "Bearer wrong"}, 401), (AS_ADMIN | {"a": "b"}, 201)]:
            assert client.post("/admin/keys", json={"tenant": "alice"}, headers=headers).status_code == status
        r = client.post("/admin/keys", content=b"x" * 5000, headers=AS_ADMIN)
        assert r.status_code == 413
    with gateway(config([BACKEND]), Clock()) as (client, _):  # no state, no snapshot: nowhere to keep a key
        r = client.post("/admin/keys", json={"tenant": "alice"}, headers=AS_ADMIN)
        assert r.status_code == 409 and r.json()["error"]["code"] == "no_key_store"
        assert "state" in r.json()["error"]["message"] and "snapshot" in r.json()["error"]["message"]
        assert client.get("/admin/keys", headers=AS_ADMIN).json() == {"store": None, "keys": [], "tenants": []}


def test_a_reload_replaces_the_config_files_keys_and_keeps_the_apis(tmp_path):
    clock = Clock()
    with gateway(cfg(tmp_path), clock) as (client, gw):
        alice, bob = make(client, tenant="alice")["key"], make(client, tenant="bob")
        # alice's config key changes, bob leaves the config
        gw.load = lambda: cfg(tmp_path, tenants=[{"name": "alice", "api_keys": ["key-alice-2"]}])
        assert client.post("/admin/reload", headers=AS_ADMIN).status_code == 200
        assert models(client, KEYS["alice"]).status_code == 401 and models(client, "key-alice-2").status_code == 200
        assert owner(client, alice) == "alice"  # the API's key outlives the reload
        r = models(client, bob["key"])
        assert r.status_code == 401 and "names tenant 'bob', which the configuration no longer has" in r.text
        assert listed(client)[bob["id"]]["orphaned"]
        r = client.post("/admin/keys", json={"tenant": "bob"}, headers=AS_ADMIN)
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_tenant"
        gw.load = lambda: cfg(tmp_path)  # bob is back: so is his key
        assert client.post("/admin/reload", headers=AS_ADMIN).status_code == 200
        assert owner(client, bob["key"]) == "bob" and not listed(client)[bob["id"]]["orphaned"]


def test_a_restart_keeps_the_keys_and_their_last_use_beside_the_snapshot(tmp_path):
    clock = Clock()
    with gateway(cfg(tmp_path), clock) as (client, _):
        kept, gone = make(client, tenant="alice", name="kept"), make(client, tenant="bob")
        clock.now = T0 + 42
        assert models(client, kept["key"]).status_code == 200
        assert client.delete(f"/admin/keys/{gone['id']}", headers=AS_ADMIN).status_code == 200
    with gateway(cfg(tmp_path), clock) as (client, _):  # the last use was written at stop
        assert owner(client, kept["key"]) == "alice" and owner(client, gone["key"]) is None
        row = listed(client)[kept["id"]]
        assert row["name"] == "kept" and row["last_used_at"] == "2027-01-01T00:00:42+00:00"
    (tmp_path / "snap.json.keys").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match=r"keys file .*snap.json.keys cannot be read .*move it away"):
        Gateway(cfg(tmp_path))


def test_a_key_the_config_names_is_its_config_tenants_and_a_reload_keeps_the_others():
    asked: list[str] = []

    def api(key: str) -> str | None:
        asked.append(key)
        return "bob" if key == "fs-api" else None

    owners = KeyOwners(config([BACKEND]).tenants)
    owners.more = api
    assert owners.get(KEYS["alice"]) == "alice" and asked == []  # the config's keys first, the API's not asked
    assert owners.get("fs-api") == "bob" and "fs-api" in owners and owners.get("nobody") is None
    owners.replace(KeyOwners(config([BACKEND], tenants=[{"name": "bob", "api_keys": ["k2"]}]).tenants))
    assert owners.get(KEYS["alice"]) is None and owners.get("k2") == "bob" and owners.get("fs-api") == "bob"


def test_a_tenant_with_api_keys_empty_is_served_by_the_apis_keys_only_and_serve_refuses_it(tmp_path):
    from fairserve.serve.config import load_config as load_serve

    carol = {"name": "carol", "api_keys": []}  # its keys are made through the API
    with gateway(cfg(tmp_path, tenants=[{"name": "alice", "api_keys": [KEYS["alice"]]}, carol]), Clock()) as (c, _):
        assert owner(c, make(c, tenant="carol")["key"]) == "carol"
    with pytest.raises(ValueError, match="needs api_keys or api_key_sha256"):
        config([BACKEND], tenants=[{"name": "carol"}])  # no key at all is still a mistake
    with pytest.raises(ValueError, match="tenant 'carol' has no key: `fairserve serve` makes no keys") as e:
        load_serve(None, {"model": "tiny-random", "tenants": [carol]})
    assert "\n" not in str(e.value)


class Swallowing:
    """A store whose read, cancelled, returns as if it had answered (as a Redis client can, cancelled mid-call)."""

    kind = "redis"

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.swallowed = False
        self.loads = 0

    async def load(self, held):
        self.loads += 1
        self.reading.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if self.swallowed:
                raise  # NOTE: only the first: a broken loop then fails the test, not hang it
            self.swallowed = True
        return None

    async def flush(self, used) -> None:
        return None


def test_stop_ends_the_polls_even_when_the_store_swallows_the_cancellation():
    async def main() -> None:
        store = Swallowing()
        keys = stopping(store)
        keys._task = asyncio.get_running_loop().create_task(keys._run(0.001, poll=True))
        await asyncio.wait_for(store.reading.wait(), 5)  # NOTE: a poll is inside the store's read
        await asyncio.wait_for(keys.stop(), 5)
        # NOTE: the loop ends where its cancellation was swallowed: no poll after it (before the fix it polled on)
        assert store.swallowed and store.loads == 1

    asyncio.run(main())


def stopping(store) -> ApiKeys:
    cfg = config(["http://127.0.0.1:9"])
    keys = ApiKeys(cfg, SimpleNamespace(shared=None), KeyOwners(cfg.tenants))
    keys.store = store
    return keys
