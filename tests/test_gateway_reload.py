"""Live configuration: POST /admin/reload while 20 streams are in flight and 50 requests queued loses none, serves a new
tenant, refuses a removed key, keeps the old configuration on a broken file (one line); SIGHUP does the same in a real
`fairserve gateway` process, a directory in the file's place included (one refusal line, no task's traceback). A timeout
reloads for the requests after it; a key only a restart applies is refused with its reason (every key is one or the
other); with shared state a backend change is refused. (The backends' reload: test_gateway_fleet_reload.py.)"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from support.gateway import ADMIN, HTTP, FakeBackend, chat_body, metric, wait_until

from fairserve.api.server import free_port, running_server
from fairserve.gateway import create_app, load_config
from fairserve.gateway.admission.scheduler import Scheduler
from fairserve.gateway.settings import reload as reload_module
from fairserve.gateway.settings.config import build_config
from fairserve.gateway.settings.reload import ReloadError

pytestmark = pytest.mark.integration

IN_FLIGHT, QUEUED = 20, 50


def toml(url: str, tenants: dict[str, list[str]], extra: str = "") -> str:
    out = f'admin_key = "{ADMIN}"\nhealth_interval_s = 0\n{extra}\n[[backends]]\nurl = "{url}"\n'
    out += f"max_inflight_requests = {IN_FLIGHT}\n"
    for name, keys in tenants.items():
        out += f'[[tenants]]\nname = "{name}"\napi_keys = {json.dumps(keys)}\n'
    return out


def post(base: str, key: str, tokens: int = 3) -> httpx.Response:
    return HTTP.post(base + "/v1/chat/completions", json=chat_body(tokens), headers={"Authorization": f"Bearer {key}"})


def reload(base: str) -> httpx.Response:
    return HTTP.post(base + "/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})


async def stream(c: httpx.AsyncClient, base: str, key: str) -> tuple[int, int]:
    """A streamed request: (status, content pieces received), the stream read to its [DONE]."""
    pieces, done = 0, False
    async with c.stream(
        "POST",
        base + "/v1/chat/completions",
        json=chat_body(8, stream=True),
        headers={"Authorization": f"Bearer {key}"},
    ) as r:
        async for line in r.aiter_lines():
            pieces += line.startswith("data: {")
            done = done or line == "data: [DONE]"
        return r.status_code, pieces if done else -1


def test_a_reload_under_load_loses_nothing_adds_a_tenant_and_refuses_a_removed_key(tmp_path):
    fake = FakeBackend(delay_s=0.03)
    path = tmp_path / "gateway.toml"
    with running_server(fake.app) as url:
        path.write_text(toml(url, {"alice": ["key-alice", "key-alice-old"], "bob": ["key-bob"]}))
        app = create_app(load_config(path), lambda: load_config(path))
        with running_server(app) as gw:

            async def scenario() -> tuple[list[tuple[int, int]], httpx.Response]:
                async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as c:
                    keys = ["key-alice", "key-bob"]
                    sent = [asyncio.ensure_future(stream(c, gw, keys[i % 2])) for i in range(IN_FLIGHT + QUEUED)]

                    def loaded() -> bool:
                        q = sum(metric(gw, "fairserve_gateway_queue_length", tenant=t) for t in ("alice", "bob"))
                        return q == QUEUED

                    assert await asyncio.to_thread(wait_until, loaded, 20)
                    # bob removed, alice's old key removed, carol added
                    path.write_text(toml(url, {"alice": ["key-alice"], "carol": ["key-carol"]}))
                    answer = await asyncio.to_thread(reload, gw)
                    return await asyncio.gather(*sent), answer

            results, answer = asyncio.run(scenario())
            assert answer.status_code == 200 and "1 added, 1 removed" in answer.json()["message"], answer.text
            # none lost (each stream whole, to its [DONE]): bob's queued requests too were served
            assert results[0][0] == 200 and results[0][1] >= 8 and results == [results[0]] * (IN_FLIGHT + QUEUED)
            assert post(gw, "key-carol").status_code == 200  # the new tenant
            assert post(gw, "key-alice-old").status_code == 401 and post(gw, "key-bob").status_code == 401
            names = [
                t["name"]
                for t in HTTP.get(gw + "/admin/tenants", headers={"Authorization": f"Bearer {ADMIN}"}).json()["tenants"]
            ]
            assert names == ["alice", "carol"]

            path.write_text("[[tenants]\nname = ")  # broken
            refused = reload(gw)
            assert refused.status_code == 400 and "\n" not in refused.json()["error"]["message"]
            assert "not valid TOML" in refused.json()["error"]["message"]
            path.write_text(toml(url, {"alice": ["key-alice"]}, extra='policy = "fcfs"'))
            assert "policy changed: only a restart" in reload(gw).json()["error"]["message"]
            assert post(gw, "key-carol").status_code == 200  # the running configuration was kept

            # alice's key now stored hashed, and a quota for carol: both apply from this reload on
            digest = hashlib.sha256(b"key-alice").hexdigest()
            text = toml(url, {"carol": ["key-carol"]}) + 'quota = { tokens = 1, per = "hour" }\n'
            text += f'[[tenants]]\nname = "alice"\napi_key_sha256 = ["{digest}"]\n'
            path.write_text(text)
            assert reload(gw).status_code == 200
            assert post(gw, "key-alice").status_code == 200
            assert post(gw, "key-carol").status_code == 200  # 0 used < 1: let through
            out = post(gw, "key-carol")
            assert out.status_code == 429 and out.json()["error"]["code"] == "insufficient_quota"

            # a model's price reloads: a request from then on is charged at it
            def charged(key: str) -> float:
                rows = HTTP.get(gw + "/admin/tenants", headers={"Authorization": f"Bearer {ADMIN}"}).json()["tenants"]
                before = next(r["service"] for r in rows if r["name"] == "alice")
                assert post(gw, key).status_code == 200
                rows = HTTP.get(gw + "/admin/tenants", headers={"Authorization": f"Bearer {ADMIN}"}).json()["tenants"]
                return next(r["service"] for r in rows if r["name"] == "alice") - before

            plain = charged("key-alice")  # prompt + 2 x 3 output tokens
            path.write_text(toml(url, {"alice": ["key-alice"]}, extra='[prices."fake-model"]\nw_p = 3.0\nw_q = 5.0'))
            assert reload(gw).status_code == 200
            assert charged("key-alice") == 3 * (plain - 2 * 3) + 5 * 3


def test_sighup_reloads_a_gateway_process_and_a_broken_file_keeps_it_running(tmp_path):
    fake = FakeBackend()
    path = tmp_path / "gateway.toml"
    with running_server(fake.app) as url, tempfile.TemporaryFile() as log:
        path.write_text(toml(url, {"alice": ["key-alice"]}))
        port = free_port()
        cmd = [sys.executable, "-m", "fairserve", "gateway", "--config", str(path), "--listen", f"127.0.0.1:{port}"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        base = f"http://127.0.0.1:{port}"
        try:

            def up() -> bool:
                try:
                    return HTTP.get(base + "/livez", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return proc.poll() is not None

            assert wait_until(up, 30, 0.1) and proc.poll() is None
            path.write_text("listen = ")
            proc.send_signal(signal.SIGHUP)

            def logged(words: str) -> bool:
                log.seek(0)
                return words in log.read().decode(errors="replace")

            assert wait_until(lambda: logged("reload refused"), 10)
            assert proc.poll() is None and post(base, "key-alice").status_code == 200
            path.unlink()
            path.mkdir()  # a file that cannot be read: refused in one line too
            proc.send_signal(signal.SIGHUP)
            assert wait_until(lambda: logged("is a directory"), 10)
            assert proc.poll() is None and post(base, "key-alice").status_code == 200
            path.rmdir()
            path.write_text(toml(url, {"alice": ["key-alice"], "dave": ["key-dave"]}))
            proc.send_signal(signal.SIGHUP)
            # NOTE: at INFO, and a tenant added is not a weight changed
            line = "INFO:     fairserve.gateway: config reloaded: 2 tenants (1 added, 0 removed), 0 weights changed"
            assert wait_until(lambda: logged(line), 10)
            assert post(base, "key-dave").status_code == 200
        finally:
            proc.terminate()
            proc.wait(10)
        log.seek(0)
        text = log.read().decode(errors="replace")
        refusals = [line for line in text.splitlines() if "reload refused" in line]
        assert len(refusals) == 2 and "not valid TOML" in refusals[0], text
        assert f"config file {path} cannot be read: it is a directory, not a regular file" in refusals[1]
        assert "Task exception" not in text and "Traceback" not in text, text


def test_a_reload_sets_no_part_s_attributes_from_outside_it():
    """Reload is two phases over the parts (gateway/component.py): it calls their `check` and `configure`, and
    assigns nothing on another object (no `gw.stalls.timeout_s = ...`, no config copied onto a part)."""
    tree = ast.parse(Path(reload_module.__file__).read_text())
    poked = [
        ast.unparse(t)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for t in ast.walk(t)
        if isinstance(t, ast.Attribute)
    ]
    assert poked == [], poked


def test_a_timeout_reloads_for_requests_from_then_on_and_a_restart_key_is_refused_with_why(tmp_path):
    fake = FakeBackend(delay_s=0.1)  # a 5-token answer takes 0.5 s
    path = tmp_path / "gateway.toml"
    with running_server(fake.app) as url:
        path.write_text(toml(url, {"alice": ["key-alice"]}))
        app = create_app(load_config(path), lambda: load_config(path))
        with running_server(app) as gw:
            assert post(gw, "key-alice", 5).status_code == 200
            path.write_text(toml(url, {"alice": ["key-alice"]}, extra="request_timeout_s = 0.2"))
            assert reload(gw).status_code == 200
            out = post(gw, "key-alice", 5)
            assert out.status_code == 504 and out.json()["error"]["code"] == "backend_timeout"
            path.write_text(toml(url, {"alice": ["key-alice"]}, extra='listen = "127.0.0.1:1"'))
            message = reload(gw).json()["error"]["message"]
            assert "listen changed: only a restart applies that (the socket is bound at start)" in message
            path.write_text(
                toml(url, {"alice": ["key-alice"]}).replace("health_interval_s = 0", "health_interval_s = 1")
            )
            assert "turns active health checks on or off" in reload(gw).json()["error"]["message"]
            assert post(gw, "key-alice", 1).status_code == 200  # still the reloaded 0.2 s: a short answer passes


def test_with_shared_state_a_backend_change_is_refused_with_how_to_roll_it_out():
    def cfg(*urls: str):
        tenants = [{"name": "alice", "api_keys": ["k"]}]
        return build_config(
            {"backends": [{"url": u} for u in urls], "tenants": tenants, "state": "redis://127.0.0.1:1/0"}
        )

    # NOTE: the scheduler's part of a reload's first phase (gateway/component.py)
    with pytest.raises(ReloadError, match="restarting the replicas one by one"):
        Scheduler.check(cfg("http://127.0.0.1:9"), cfg("http://127.0.0.1:9", "http://127.0.0.1:10"))
    Scheduler.check(cfg("http://127.0.0.1:9"), cfg("http://127.0.0.1:9"))  # nothing changed: fine
