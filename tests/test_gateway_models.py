"""Several models behind one gateway, proved with the official `openai` client against two `fairserve emulate`
processes serving different models: each model's requests reach only its backend (which the gateway learned from
the backends' /v1/models), /v1/models lists the union, an unknown model is a 404 `model_not_found`, and with model A
saturated by a heavy tenant, model B's requests wait no longer than B's own load makes them (global scope: one
ledger, where a strict admission order would hold B behind A's queue). The queue waits come from the usage log."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from support.gateway import HTTP, wait_until
from support.processes import serve as serve_process

from fairserve.api.server import running_server
from fairserve.gateway import build_config, create_app

KEYS = {"heavy": "key-heavy", "light": "key-light", "only-b": "key-only-b"}
LIMIT = 2  # requests in flight at each emulator


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    usage = tmp_path_factory.mktemp("usage") / "usage.jsonl"
    with (
        serve_process("emulate", "--model", "model-a", "--time-scale", "10") as a,
        serve_process("emulate", "--model", "model-b", "--time-scale", "10") as b,
    ):
        cfg = build_config(
            {
                "backends": [{"url": a, "max_inflight_requests": LIMIT}, {"url": b, "max_inflight_requests": LIMIT}],
                "scope": "global",
                "health_interval_s": 2,  # NOTE: the models are read from each backend's /v1/models at start
                "usage_log": str(usage),
                "tenants": [
                    {"name": t, "api_keys": [k], **({"models": ["model-b"]} if t == "only-b" else {})}
                    for t, k in KEYS.items()
                ],
            }
        )
        with running_server(create_app(cfg)) as url:
            yield {"gateway": url, "a": a, "b": b, "usage": usage}


def emulator_requests(url: str) -> float:
    text = HTTP.get(url + "/metrics").text
    return sum(
        float(m) for m in re.findall(r'^fairserve_emulator_requests_total\{outcome="finished"\} (\S+)$', text, re.M)
    )


def usage_lines(fleet) -> list[dict]:
    return [json.loads(line) for line in fleet["usage"].read_text().splitlines()]


def client(fleet, tenant: str) -> OpenAI:
    return OpenAI(base_url=fleet["gateway"] + "/v1", api_key=KEYS[tenant], max_retries=0)


def test_each_model_reaches_only_its_backend_and_models_lists_the_union(fleet):
    c = client(fleet, "light")
    assert sorted(m.id for m in c.models.list()) == ["model-a", "model-b"]
    before = emulator_requests(fleet["a"]), emulator_requests(fleet["b"])
    for model in ["model-a", "model-b", "model-b", "model-a", "model-b"]:
        r = c.completions.create(model=model, prompt="hello", max_tokens=3)
        assert r.usage.completion_tokens == 3
    assert wait_until(lambda: emulator_requests(fleet["a"]) == before[0] + 2)
    assert wait_until(lambda: emulator_requests(fleet["b"]) == before[1] + 3)
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-9", prompt="hello", max_tokens=3)
    assert e.value.code == "model_not_found" and "model-a, model-b" in e.value.message


def test_a_tenant_limited_to_one_model_gets_403_for_another(fleet):
    c = client(fleet, "only-b")
    assert c.completions.create(model="model-b", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(openai.PermissionDeniedError) as e:
        c.completions.create(model="model-a", prompt="hi", max_tokens=2)
    assert e.value.code == "model_not_allowed" and "may use: model-b" in e.value.message


async def b_load(fleet, name: str) -> list[str]:
    """The light tenant's load on model B: 12 requests, 3 at a time (B takes 2: B's own queue); their ids."""
    ids = [f"b-{name}-{i}" for i in range(12)]
    async with AsyncOpenAI(base_url=fleet["gateway"] + "/v1", api_key=KEYS["light"], max_retries=0) as c:
        sem = asyncio.Semaphore(3)

        async def one(rid: str) -> None:
            async with sem:
                await c.completions.create(
                    model="model-b", prompt="hello " * 4, max_tokens=8, extra_headers={"X-Request-Id": rid}
                )

        await asyncio.gather(*(one(rid) for rid in ids))
    return ids


def test_a_saturated_model_does_not_hold_up_another(fleet):
    base = fleet["gateway"]

    def queued(tenant: str) -> int:
        text = HTTP.get(base + "/metrics").text
        m = re.search(rf'^fairserve_gateway_queue_length\{{tenant="{tenant}"\}} (\S+)$', text, re.M)
        return int(float(m.group(1))) if m else 0

    async def run() -> tuple[list[str], list[str]]:
        alone = await b_load(fleet, "alone")
        stop = asyncio.Event()
        async with AsyncOpenAI(base_url=base + "/v1", api_key=KEYS["heavy"], max_retries=0) as heavy:

            async def flood() -> None:
                while not stop.is_set():
                    await heavy.completions.create(model="model-a", prompt="hello " * 8, max_tokens=64)

            tasks = [asyncio.create_task(flood()) for _ in range(10)]
            deadline = time.monotonic() + 20
            while await asyncio.to_thread(queued, "heavy") < 5:  # NOTE: A saturated: the heavy tenant's queue
                assert time.monotonic() < deadline, "model A never had a queue"
            loaded = await b_load(fleet, "loaded")
            assert await asyncio.to_thread(queued, "heavy") >= 3  # A was saturated all along
            stop.set()
            await asyncio.gather(*tasks)
        return alone, loaded

    alone, loaded = asyncio.run(run())
    lines = {r["request_id"]: r for r in usage_lines(fleet)}
    wait_alone = [lines[i]["queue_wait_s"] for i in alone]
    wait_loaded = [lines[i]["queue_wait_s"] for i in loaded]
    heavy = [r["queue_wait_s"] for r in lines.values() if r["tenant"] == "heavy" and r["outcome"] == "ok"]
    assert all(lines[i]["outcome"] == "ok" and lines[i]["model"] == "model-b" for i in alone + loaded)
    med_alone, med_loaded = statistics.median(wait_alone), statistics.median(wait_loaded)
    print(
        f"model B queue wait, median / max: alone {med_alone * 1e3:.1f} / {max(wait_alone) * 1e3:.1f} ms, "
        f"with model A saturated {med_loaded * 1e3:.1f} / {max(wait_loaded) * 1e3:.1f} ms; "
        f"model A's heavy tenant: median {statistics.median(heavy) * 1e3:.0f} ms"
    )
    # B's own queue (3 sent, 2 served at a time) is there either way; A's backlog adds nothing to it
    assert med_loaded <= med_alone + 0.05 and max(wait_loaded) <= max(wait_alone) + 0.1, (wait_alone, wait_loaded)
    assert statistics.median(heavy) > 4 * max(med_loaded, 0.02)  # A's requests did queue
