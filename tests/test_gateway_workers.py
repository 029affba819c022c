"""`fairserve gateway --workers N` (gateway/http/workers.py): N gateway processes on one port, each a replica of the
shared state on a real redis-server. Connections reach both workers, which see each other through Redis; requests
through the official `openai` client are served and charged in one ledger; SIGTERM to the parent stops every worker
and exits 0. Without shared state, N workers are refused with one line."""

from __future__ import annotations

import time

import httpx
import pytest
from openai import OpenAI
from support.gateway import KEYS, FakeBackend
from support.processes import fairserve_process
from support.redis_server import redis_server

from fairserve.api.server import running_server
from fairserve.cli import main

pytestmark = pytest.mark.integration


def replicas_seen(url: str, want: int, timeout_s: float = 20.0) -> tuple[set[str], int]:
    """The replica ids that answer /healthz on new connections, until `want` are seen and each counts `want` live."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with httpx.Client(timeout=5) as fresh:  # NOTE: a new connection each time: the kernel picks a worker per one
            state = fresh.get(url + "/healthz").json()["shared_state"]
        seen.add(state["replica"])
        if len(seen) >= want and state["replicas"] >= want:
            return seen, state["replicas"]
        time.sleep(0.05)
    return seen, 0


def test_two_workers_share_one_port_and_one_ledger_and_stop_together(tmp_path):
    fake = FakeBackend()
    with redis_server() as redis, running_server(fake.app) as backend:
        toml = tmp_path / "gateway.toml"
        toml.write_text(
            f'state = "{redis.url}"\nstate_interval_s = 0.1\nadmin_key = "adm"\n[[backends]]\nurl = "{backend}"\n'
            + "".join(f'[[tenants]]\nname = "{t}"\napi_keys = ["{k}"]\n' for t, k in KEYS.items())
        )
        with fairserve_process("gateway", "--workers", "2", "--config", str(toml)) as (url, proc):
            seen, live = replicas_seen(url, 2)
            assert len(seen) == 2 and live == 2, seen
            for tenant in ("alice", "bob"):
                for _ in range(3):
                    with OpenAI(base_url=url + "/v1", api_key=KEYS[tenant], max_retries=0) as client:
                        out = client.chat.completions.create(
                            model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                        )
                    assert out.choices[0].message.content
            # NOTE: one ledger: each worker, read on new connections, shows the same service of each tenant, the
            # same for both (their requests alike), which neither worker served alone
            services = one_ledger(url)
            assert len(services) == 1 and services[0][0] == services[0][1] > 0, services
            proc.terminate()
            assert proc.wait(20) == 0


def one_ledger(url: str, reads: int = 12, timeout_s: float = 20.0) -> list[tuple[float, float]]:
    """(alice's service, bob's) as `reads` reads in a row on new connections give them, once they agree."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = set()
        for _ in range(reads):
            with httpx.Client(timeout=5, headers={"Authorization": "Bearer adm"}) as fresh:
                rows = {t["name"]: t["service"] for t in fresh.get(url + "/admin/tenants").json()["tenants"]}
            got.add((rows["alice"], rows["bob"]))
        if len(got) == 1 or time.monotonic() > deadline:
            return sorted(got)
        time.sleep(0.2)


def test_workers_without_shared_state_are_one_clear_error(capsys):
    assert main(["gateway", "--workers", "2", "--backend", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "--workers N runs N replicas of one gateway" in err and "Traceback" not in err
