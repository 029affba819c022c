"""A reload applies priorities live, for the requests after it (through HTTP): a demoted tenant's next request runs at
level 1, a promoted one's at level 0, a tenant whose `priorities` were dropped is refused (400 invalid_priority) the
level it could name before, and a tenant removed in one reload and added back at another level in the next runs at
the new level, may name no other, and /admin/tenants shows it. The level a request ran at: the one whose dispatch count
(`fairserve_gateway_priority_queue_wait_seconds_count`) went up by one. Each under one gateway and under two
`fairserve gateway --state` replicas sharing a real redis-server, both reloaded with the new file (POST /admin/reload)
and both checked."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.gateway import ADMIN, HTTP, FakeBackend, admin_tenants, chat_body, wait_until
from support.processes import fairserve_process
from support.redis_server import redis_server

from fairserve.api.server import running_server
from fairserve.gateway import create_app, load_config

pytestmark = pytest.mark.integration

COUNT = re.compile(r'^fairserve_gateway_priority_queue_wait_seconds_count\{priority="(-?\d+)"\} (\S+)$', re.M)


def tenant(name: str, priority: int, priorities: list[int] | None = None) -> dict[str, Any]:
    """A tenant table: its key is `key-NAME`; `priorities`: the levels its requests may name."""
    out: dict[str, Any] = {"name": name, "api_keys": [f"key-{name}"], "priority": priority}
    if priorities is not None:
        out["priorities"] = priorities
    return out


def toml(url: str, tenants: list[dict[str, Any]]) -> str:
    out = f'admin_key = "{ADMIN}"\nhealth_interval_s = 0\n[[backends]]\nurl = "{url}"\n'
    for t in tenants:
        out += "[[tenants]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in t.items())
    return out


@dataclass
class Deployment:
    """Gateways (`bases`) serving the config file at `path`, in front of the fake backend at `url`."""

    path: Path
    url: str
    bases: list[str]

    def load(self, *tenants: dict[str, Any]) -> None:
        """Write the file with these tenants and reload every gateway with it."""
        self.path.write_text(toml(self.url, list(tenants)))
        for base in self.bases:
            r = HTTP.post(base + "/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status_code == 200, (base, r.text)


def counts(base: str) -> dict[int, float]:
    """Requests dispatched so far, by priority level."""
    return {int(lv): float(n) for lv, n in COUNT.findall(HTTP.get(base + "/metrics").text)}


def send(base: str, name: str, **body: Any):
    return HTTP.post(
        base + "/v1/chat/completions", json=chat_body(1, **body), headers={"Authorization": f"Bearer key-{name}"}
    )


def ran_at(base: str, name: str, **body: Any) -> int:
    """The level one request of `name` (with these body fields) ran at: the only level whose count rose, by one."""
    before = counts(base)
    r = send(base, name, **body)
    assert r.status_code == 200, r.text
    rose = {lv: n - before.get(lv, 0.0) for lv, n in counts(base).items() if n != before.get(lv, 0.0)}
    assert len(rose) == 1 and set(rose.values()) == {1.0}, rose
    return next(iter(rose))


def refused_code(base: str, name: str, **body: Any) -> tuple[int, str | None]:
    """The status and error code of one request of `name`."""
    r = send(base, name, **body)
    return r.status_code, r.json().get("error", {}).get("code")


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    with running_server(FakeBackend().app) as url:
        yield url


@contextlib.contextmanager
def one_gateway(path: Path) -> Iterator[list[str]]:
    with running_server(create_app(load_config(path), lambda: load_config(path))) as base:
        yield [base]


@contextlib.contextmanager
def two_replicas(path: Path) -> Iterator[list[str]]:
    with redis_server() as redis, contextlib.ExitStack() as stack:
        args = ["--config", str(path), "--state", redis.url, "--state-interval", "0.01"]
        args += ["--no-access-log", "--log-level", "warning"]
        bases = [stack.enter_context(fairserve_process("gateway", *args))[0] for _ in range(2)]

        def sharing() -> bool:
            states = [HTTP.get(b + "/healthz").json()["shared_state"] for b in bases]
            return all(s["up"] and s["replicas"] == 2 for s in states)

        assert wait_until(sharing), "the replicas did not both join the shared state"
        yield bases


@pytest.fixture(scope="module", params=["one gateway", "two replicas"])
def deployment(request, backend, tmp_path_factory) -> Iterator[Deployment]:
    path = tmp_path_factory.mktemp("reload-levels") / "gateway.toml"
    path.write_text(toml(backend, [tenant("idle", 0)]))
    start = one_gateway if request.param == "one gateway" else two_replicas
    with start(path) as bases:
        yield Deployment(path, backend, bases)


@pytest.mark.parametrize("before, after", [(0, 1), (1, 0)], ids=["demoted", "promoted"])
def test_a_demoted_or_promoted_tenant_runs_its_next_request_at_the_new_level(deployment, before, after):
    deployment.load(tenant("moved", before))
    assert [ran_at(b, "moved") for b in deployment.bases] == [before] * len(deployment.bases)
    deployment.load(tenant("moved", after))
    assert [ran_at(b, "moved") for b in deployment.bases] == [after] * len(deployment.bases)
    assert [admin_tenants(b)["moved"]["priority"] for b in deployment.bases] == [after] * len(deployment.bases)


def test_a_dropped_allowance_refuses_the_level_it_allowed(deployment):
    deployment.load(tenant("limited", 1, [0, 1]))
    assert [ran_at(b, "limited", priority=0) for b in deployment.bases] == [0] * len(deployment.bases)
    deployment.load(tenant("limited", 1))
    for b in deployment.bases:
        assert refused_code(b, "limited", priority=0) == (400, "invalid_priority")
        assert ran_at(b, "limited") == 1 and ran_at(b, "limited", priority=1) == 1


def test_a_tenant_removed_and_added_back_runs_at_its_new_level_and_may_name_no_other(deployment):
    deployment.load(tenant("returning", 0, [0, 1]), tenant("other", 0))
    assert [ran_at(b, "returning") for b in deployment.bases] == [0] * len(deployment.bases)
    assert [ran_at(b, "returning", priority=1) for b in deployment.bases] == [1] * len(deployment.bases)
    deployment.load(tenant("other", 0))
    assert [send(b, "returning").status_code for b in deployment.bases] == [401] * len(deployment.bases)
    deployment.load(tenant("other", 0), tenant("returning", 1))  # no `priorities` now
    for b in deployment.bases:
        assert ran_at(b, "returning") == 1
        assert refused_code(b, "returning", priority=0) == (400, "invalid_priority")
        assert admin_tenants(b)["returning"]["priority"] == 1
