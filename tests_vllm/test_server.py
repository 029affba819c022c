"""vLLM's OpenAI server with `--scheduler-cls fairserve...VTCScheduler`: the client travels in `vllm_xargs`; and the
gateway in front of it naming the tenant to the engine."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fairserve.engines.vllm_scheduler import SCHEDULER_PATH

ROOT = Path(__file__).resolve().parent.parent
MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode}) during startup:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the server was not ready after {timeout:.0f}s:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def vllm_server(model_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = dict(
        os.environ,
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
        VLLM_LOGGING_LEVEL="INFO",
        FAIRSERVE_ALLOWED_PRIORITIES="srv/mixed=1|2",
    )
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--scheduler-cls",
        SCHEDULER_PATH,
        "--max-num-seqs",
        "2",
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--dtype",
        "float32",
        "--no-enable-prefix-caching",
        "--scheduling-policy",
        "priority",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/health", log)
        yield f"http://127.0.0.1:{port}", log
    finally:
        stop(proc)


async def completion_order(
    url: str,
    heavy: dict,
    light: dict,
    n_heavy: int = 10,
    n_light: int = 2,
    headers_heavy: dict | None = None,
    headers_light: dict | None = None,
) -> list[str]:
    """The heavy client's backlog first, the light client's requests once the first heavy one is done (the rest
    of the backlog is queued then, whatever the machine's speed); the order they complete in."""
    order: list[str] = []
    body = {"model": MODEL, "prompt": "fair " * 10, "ignore_eos": True, "temperature": 0}

    async def one(client: httpx.AsyncClient, name: str, extra: dict, headers: dict | None, tokens: int) -> None:
        r = await client.post(
            f"{url}/v1/completions", json=body | extra | {"max_tokens": tokens}, headers=headers or {}
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == tokens
        order.append(name)

    async with httpx.AsyncClient(timeout=120) as client:
        tasks = [asyncio.create_task(one(client, "heavy", heavy, headers_heavy, 32)) for _ in range(n_heavy)]
        while not order:
            await asyncio.sleep(0.02)
        tasks += [asyncio.create_task(one(client, "light", light, headers_light, 32)) for _ in range(n_light)]
        await asyncio.gather(*tasks)
    return order


def light_median_position(order: list[str]) -> float:
    return statistics.median(i for i, name in enumerate(order) if name == "light")


def test_openai_server_takes_the_client_from_vllm_xargs(vllm_server):
    url, log = vllm_server
    assert "waiting queue ordered by vtc" in log.read_text()
    named = asyncio.run(
        completion_order(
            url, {"vllm_xargs": {"fairserve_client": "srv/heavy"}}, {"vllm_xargs": {"fairserve_client": "srv/light"}}
        )
    )
    # without xargs every request is the client "default": the same server serves them first come, first served
    anonymous = asyncio.run(completion_order(url, {}, {}))
    assert light_median_position(named) < 6, named  # before most of the 10 heavy requests
    assert light_median_position(anonymous) >= 10, anonymous  # after all of them


def test_openai_server_honours_the_priority_a_tenant_may_name(vllm_server):
    """One tenant (FAIRSERVE_ALLOWED_PRIORITIES=srv/mixed=1|2): its backlog at priority 2 (the body's `priority`),
    then two requests at 1 (vLLM's `X-Vllm-Priority` header), which overtake the backlog's waiting requests."""
    url, _ = vllm_server
    mixed = {"vllm_xargs": {"fairserve_client": "srv/mixed"}}
    order = asyncio.run(completion_order(url, mixed | {"priority": 2}, mixed, headers_light={"X-Vllm-Priority": "1"}))
    assert light_median_position(order) < 6, order  # one tenant: without priorities, first come, first served


# ---- gateway -> real vLLM, the tenant named to the engine -----------------------------------------------------------
# The gateway option that forwards the tenant as `vllm_xargs: {fairserve_client: TENANT}` is `engine_tenant=1` in
# `--backend URL,engine_tenant=1`. This test runs as soon as the gateway knows that option; until then it is skipped
# (and only then).
def gateway_knows_engine_tenant() -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "fairserve.cli", "gateway", "--help"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    )
    return "engine_tenant" in out.stdout


def test_gateway_names_the_tenant_to_the_engine(vllm_server, tmp_path):
    if not gateway_knows_engine_tenant():
        pytest.skip("the gateway has no `engine_tenant=1` backend option yet")
    url, _ = vllm_server
    port = free_port()
    log = tmp_path / "gateway.log"
    cmd = [
        sys.executable,
        "-m",
        "fairserve.cli",
        "gateway",
        "--listen",
        f"127.0.0.1:{port}",
        "--backend",
        f"{url},engine_tenant=1,max_requests=64",
        "--tenant",
        "gw-heavy:kh",
        "--tenant",
        "gw-light:kl",
        "--model",
        MODEL,
        "--no-access-log",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        )
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/healthz", log, timeout=60)
        # the gateway forwards at once (64 in flight): the order is the engine's, by the tenants it was told
        order = asyncio.run(
            completion_order(
                f"http://127.0.0.1:{port}",
                {},
                {},
                headers_heavy={"Authorization": "Bearer kh"},
                headers_light={"Authorization": "Bearer kl"},
            )
        )
    finally:
        stop(proc)
    assert light_median_position(order) < 6, order


def test_the_gateways_footprint_bounds_what_vllm_reports(vllm_server, model_dir):
    """For each shape of request, the output bound of the footprint the gateway holds on a quota
    (gateway/admission/footprint.py) is what vLLM generates for the body the gateway sends it, every output to its bound
    (`ignore_eos`): every prompt of a list times `n`, and `default_max_tokens` sent when the client sets none; a
    completion's prompt, counted with the model's own tokenizer, is at least what vLLM counts."""
    from fairserve.api.tokens import token_counter
    from fairserve.gateway.http.body import parse_body, upstream_body

    url, _ = vllm_server
    count = token_counter(f"hf:{model_dir / 'tokenizer.json'}")
    talk = [
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "What is fair sharing of a server?"},
        {"role": "assistant", "content": "Each client gets its share."},
        {"role": "user", "content": "And when one client sends more?"},
    ]
    shapes = {
        "completions, a prompt list and n": ("completions", {"prompt": ["fair " * 9, "share", "x y z"], "n": 2}),
        "completions, token ids": ("completions", {"prompt": [[5, 6, 7, 8], [9, 10]], "max_tokens": 7}),
        "chat, four messages": ("chat", {"messages": talk, "max_tokens": 9}),
        "chat, n and no max_tokens": ("chat", {"messages": talk[:2], "n": 2}),
    }
    with httpx.Client(timeout=120) as c:
        for shape, (kind, body) in shapes.items():
            raw = json.dumps({"model": MODEL, "ignore_eos": True, "temperature": 1, "seed": 1, **body}).encode()
            parsed = parse_body(raw, kind, count, default_max_tokens=6)
            path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
            sent = upstream_body(parsed)
            r = c.post(url + path, content=sent, headers={"content-type": "application/json"})
            assert r.status_code == 200, (shape, r.text)
            usage, fp = r.json()["usage"], parsed.footprint
            assert usage["completion_tokens"] == fp.max_output, (shape, usage, fp)  # every output to its bound
            if kind == "completions":
                assert usage["prompt_tokens"] <= fp.prompt_tokens and usage["total_tokens"] <= fp.tokens, (shape, fp)
            # NOTE: a chat's prompt is its text and 4 tokens a message for the template's role markers (docs/gateway.md,
            # A request's footprint); this model's toy tokenizer spells `<|user|>` in ~10 tokens, more than real
            # templates take, and the charge is corrected from the usage when the request ends
