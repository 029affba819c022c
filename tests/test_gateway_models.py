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
from datetime import datetime

import openai
import orjson
import pytest
from openai import AsyncOpenAI, OpenAI
from support.gateway import HTTP, wait_until
from support.processes import serve as serve_process

pytestmark = pytest.mark.integration

ADMIN = "models-admin"
KEYS = {"heavy": "key-heavy", "light": "key-light", "only-b": "key-only-b", "org/member": "key-org-member"}
LIMITS = {"a": 2, "b": 4}  # requests in flight at each emulator
PRICE_A = {"w_p": 2.0, "w_q": 4.0}  # a token of model A costs twice one of model B (w_p = 1, w_q = 2)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    usage = tmp / "usage.jsonl"
    with (
        serve_process("emulate", "--model", "model-a", "--time-scale", "10") as a,
        serve_process("emulate", "--model", "model-b", "--time-scale", "10") as b,
    ):
        # NOTE: the gateway in a process of its own, started from a TOML file as a user would (the clients here
        # would otherwise share its interpreter)
        config = tmp / "gateway.toml"
        limited = {"only-b": ', models = ["model-b"]'}
        tenants = "\n".join(f'  {{ name = "{t}", api_keys = ["{k}"]{limited.get(t, "")} }},' for t, k in KEYS.items())
        config.write_text(
            f"""
scope = "global"
admin_key = "{ADMIN}"
health_interval_s = 2    # the models are read from each backend's /v1/models at start
usage_log = "{usage}"
backends = [
  {{ url = "{a}", max_inflight_requests = {LIMITS["a"]} }},
  {{ url = "{b}", max_inflight_requests = {LIMITS["b"]} }},
]
tenants = [
{tenants}
]
groups = [{{ name = "org", models = ["model-a"] }}]
[prices."model-a"]
w_p = {PRICE_A["w_p"]}
w_q = {PRICE_A["w_q"]}
"""
        )
        with serve_process("gateway", "--config", str(config), "--no-access-log") as url:
            yield {"gateway": url, "a": a, "b": b, "usage": usage}


QUEUE = r'^fairserve_gateway_queue_length\{tenant="([^"]+)"\} (\S+)$'


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


def test_a_tenant_limited_to_one_model_gets_403_for_another_and_sees_only_its_own(fleet):
    c = client(fleet, "only-b")
    # NOTE: /v1/models lists what the key may use: its own allowance, its group's, or (the admin key) every model
    assert [m.id for m in c.models.list()] == ["model-b"]
    assert [m.id for m in client(fleet, "org/member").models.list()] == ["model-a"]
    admin = OpenAI(base_url=fleet["gateway"] + "/v1", api_key=ADMIN, max_retries=0)
    assert sorted(m.id for m in admin.models.list()) == ["model-a", "model-b"]
    assert c.completions.create(model="model-b", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(openai.PermissionDeniedError) as e:
        c.completions.create(model="model-a", prompt="hi", max_tokens=2)
    assert e.value.code == "model_not_allowed" and "may use: model-b" in e.value.message


async def b_load(fleet, name: str) -> list[str]:
    """The light tenant's load on model B: 18 requests, 6 at a time (B takes 4: B's own queue); their ids."""
    ids = [f"b-{name}-{i}" for i in range(18)]
    async with AsyncOpenAI(base_url=fleet["gateway"] + "/v1", api_key=KEYS["light"], max_retries=0) as c:
        sem = asyncio.Semaphore(6)

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

            tasks = [asyncio.create_task(flood()) for _ in range(8)]
            deadline = time.monotonic() + 20
            while await asyncio.to_thread(queued, "heavy") < 5:  # NOTE: A saturated: the heavy tenant's queue
                assert time.monotonic() < deadline, "model A never had a queue"
            pools = dict(
                re.findall(
                    r'^fairserve_gateway_pool_queue_length\{pool="([^"]+)"\} (\S+)$',
                    HTTP.get(base + "/metrics").text,
                    re.M,
                )
            )
            assert float(pools["model-a"]) >= 1 and "model-b" in pools  # each pool's own queue
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
    # B's own queue (6 sent, 4 served at a time) is there either way; A's backlog adds nothing to it
    assert med_loaded <= med_alone + 0.05 and max(wait_loaded) <= max(wait_alone) + 0.25, (wait_alone, wait_loaded)
    assert statistics.median(heavy) > 4 * max(med_loaded, 0.02)  # A's requests did queue


def admin_rows(base: str) -> dict[str, dict]:
    rows = HTTP.get(base + "/admin/tenants", headers={"Authorization": f"Bearer {ADMIN}"}).json()["tenants"]
    return {r["name"]: r for r in rows}


def service(base: str) -> dict[str, float]:
    return {name: r["service"] for name, r in admin_rows(base).items()}


def test_global_scope_heavy_use_of_the_expensive_model_lowers_the_share_on_the_cheap_one(fleet):
    """The heavy tenant keeps model A (twice the price) busy and competes on model B with the light tenant; one
    account each over the fleet: while both are backlogged, their service (at each model's price) is equal, so the
    heavy one gets less than half of model B, by what its model-A use cost."""
    base = fleet["gateway"]
    tokens = 16
    assert wait_until(lambda: all(r["in_flight"] == r["queue_length"] == 0 for r in admin_rows(base).values()))
    # NOTE: the earlier tests' use is forgotten: both start from equal counters
    assert HTTP.post(base + "/admin/reset", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200

    async def run() -> tuple[dict[str, dict], dict[str, dict], float, float]:
        clients = {t: AsyncOpenAI(base_url=base + "/v1", api_key=KEYS[t], max_retries=0) for t in ("heavy", "light")}

        async def one(tenant: str, model: str) -> None:
            await clients[tenant].completions.create(model=f"model-{model}", prompt="hi", max_tokens=tokens)

        # NOTE: all sent at once, so both tenants stay backlogged however slowly this process runs
        sent = [("heavy", "a")] * 30 + [("heavy", "b")] * 40 + [("light", "b")] * 100
        tasks = [asyncio.create_task(one(t, m)) for t, m in sent]

        def backlogged(rows: dict[str, dict]) -> bool:
            return rows["heavy"]["queue_length"] > 0 and rows["light"]["queue_length"] > 0

        deadline = time.monotonic() + 20
        while not backlogged(first := await asyncio.to_thread(admin_rows, base)):
            assert time.monotonic() < deadline, "the tenants never had a queue together"
        t0, last = time.time(), first
        while time.time() < t0 + 3.0 and backlogged(rows := await asyncio.to_thread(admin_rows, base)):
            last, t1 = rows, time.time()
        await asyncio.gather(*tasks)
        for c in clients.values():
            await c.close()
        return first, last, t0, t1

    first, last, t0, t1 = asyncio.run(run())
    assert t1 - t0 >= 1.0, (t0, t1)  # a window of both backlogged
    got = {name: last[name]["service"] - first[name]["service"] for name in ("heavy", "light")}
    lines = [r for r in usage_lines(fleet) if t0 <= datetime.fromisoformat(r["time"]).timestamp() <= t1]
    out = {
        (t, m): sum(r["output_tokens"] for r in lines if r["tenant"] == t and r["model"] == f"model-{m}")
        for t in ("heavy", "light")
        for m in ("a", "b")
    }
    share = out["heavy", "b"] / (out["heavy", "b"] + out["light", "b"])
    ratio = got["heavy"] / got["light"]
    # at one price for both models the heavy tenant's service would have been this much of the light one's
    unpriced = (got["heavy"] - (PRICE_A["w_q"] - 2) * out["heavy", "a"]) / got["light"]
    print(
        f"global scope, {t1 - t0:.1f} s both backlogged: the heavy tenant's share of model B {share:.3f} "
        f"({out['heavy', 'a']} tokens of model A at 2x the price); its service / the light tenant's "
        f"{ratio:.3f} at the prices ({unpriced:.3f} at one price)"
    )
    assert out["heavy", "a"] > 30 and out["light", "b"] > 100, out
    assert share < 0.4, out  # less than the half it would get on B alone
    assert 0.85 <= ratio <= 1.15, (got, out)  # equal service, at each model's price
    assert unpriced < 0.85, (got, out)


def test_the_usage_log_has_a_line_per_request(fleet):
    c = client(fleet, "only-b")
    stream = c.chat.completions.create(
        model="model-b",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=5,
        stream=True,
        extra_headers={"X-Request-Id": "usage-ok"},
    )
    assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content) == 5
    # NOTE: a tenant limited to some models gets 403 for any other, known or not (it learns nothing of the rest)
    for tenant, model, rid in (
        ("only-b", "model-a", "usage-403"),
        ("only-b", "gpt-9", "usage-403b"),
        ("light", "gpt-9", "usage-404"),
    ):
        with pytest.raises(openai.APIStatusError):
            client(fleet, tenant).completions.create(
                model=model, prompt="hi", max_tokens=2, extra_headers={"X-Request-Id": rid}
            )
    assert wait_until(lambda: "usage-ok" in {r["request_id"] for r in usage_lines(fleet)})
    lines = {r["request_id"]: r for r in usage_lines(fleet)}
    ok = lines["usage-ok"]
    assert ok["tenant"] == "only-b" and ok["model"] == "model-b" and ok["endpoint"] == "chat"
    assert ok["outcome"] == "ok" and ok["output_tokens"] == 5 and ok["prompt_tokens"] > 0
    assert ok["service"] == ok["prompt_tokens"] + 2 * 5  # model B's price: w_p = 1, w_q = 2
    assert 0 <= ok["queue_wait_s"] <= ok["ttft_s"] <= ok["duration_s"] and ok["backend"] == fleet["b"]
    assert lines["usage-403"]["outcome"] == lines["usage-403b"]["outcome"] == "model_not_allowed"
    assert lines["usage-404"]["outcome"] == "model_not_found"
    assert lines["usage-403"]["service"] == 0 and lines["usage-404"]["queue_wait_s"] is None
    priced = [r for r in lines.values() if r["model"] == "model-a" and r["outcome"] == "ok"]
    assert priced and all(r["service"] == 2 * r["prompt_tokens"] + 4 * r["output_tokens"] for r in priced)


def test_a_lone_surrogate_is_refused_at_the_edge_and_every_usage_line_is_strict_json(fleet):
    """Strings a client controls reach the usage log (`model`); JSON's escapes can spell a lone UTF-16 surrogate,
    which strict readers (orjson, billing pipelines) refuse: such a body is a 400, and every line stays valid."""
    sent = {
        "surrogate-model": b'{"model": "a\\ud800b", "prompt": "hi", "max_tokens": 2}',
        "surrogate-prompt": b'{"model": "model-b", "prompt": "x\\udfffy", "max_tokens": 2}',
        "surrogate-messages": b'{"model": "model-b", "messages": [{"role": "user", "content": "\\ud83d"}]}',
        "astral-model": '{"model": "m\u00f6del-\U0001f600\u2028", "prompt": "hi", "max_tokens": 2}'.encode(),
    }
    paths = {"surrogate-messages": "/v1/chat/completions"}
    for rid, raw in sent.items():
        r = HTTP.post(
            fleet["gateway"] + paths.get(rid, "/v1/completions"),
            content=raw,
            headers={
                "Authorization": f"Bearer {KEYS['light']}",
                "X-Request-Id": rid,
                "content-type": "application/json",
            },
        )
        if rid.startswith("surrogate"):
            assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], (rid, r.text)
        else:
            assert r.status_code == 404  # NOTE: valid text, an unknown model: logged as sent
    assert wait_until(lambda: set(sent) <= {r["request_id"] for r in usage_lines(fleet)})
    raw_lines = fleet["usage"].read_bytes().splitlines()
    rows = {row["request_id"]: row for row in map(orjson.loads, raw_lines)}  # NOTE: raises on any invalid line
    assert rows["astral-model"]["model"] == "m\u00f6del-\U0001f600\u2028"
    assert all(rows[rid]["outcome"] == "invalid" for rid in sent if rid.startswith("surrogate"))


def usage_line(fleet, rid: str) -> dict:
    assert wait_until(lambda: rid in {r["request_id"] for r in usage_lines(fleet)})
    return next(r for r in usage_lines(fleet) if r["request_id"] == rid)


def test_embeddings_are_queued_and_charged_w_p_times_the_backends_input_tokens(fleet):
    c = client(fleet, "light")
    r = c.embeddings.create(model="model-a", input=["hello world", "fair"], extra_headers={"X-Request-Id": "emb-a"})
    assert len(r.data) == 2 and len(r.data[0].embedding) == 32  # base64 on the wire, decoded by the client
    line = usage_line(fleet, "emb-a")
    assert line["endpoint"] == "embeddings" and line["outcome"] == "ok" and line["backend"] == fleet["a"]
    assert line["prompt_tokens"] == r.usage.prompt_tokens and line["output_tokens"] == 0
    assert line["service"] == PRICE_A["w_p"] * r.usage.prompt_tokens  # model A's w_p
    f = c.embeddings.create(
        model="model-b", input="hello", encoding_format="float", extra_headers={"X-Request-Id": "emb-b"}
    )
    assert usage_line(fleet, "emb-b")["service"] == f.usage.prompt_tokens and f.data[0].embedding[0] != 0


def test_responses_streamed_and_not_charged_from_their_events_and_usage(fleet):
    c = client(fleet, "light")
    r = c.responses.create(
        model="model-b", input="hello there", max_output_tokens=6, extra_headers={"X-Request-Id": "resp-1"}
    )
    assert r.usage.output_tokens == 6 and r.output_text
    line = usage_line(fleet, "resp-1")
    assert (line["prompt_tokens"], line["output_tokens"]) == (r.usage.input_tokens, 6)
    # NOTE: not streamed, its first output is its whole answer (it was null before)
    assert line["ttft_s"] is not None and 0 <= line["queue_wait_s"] <= line["ttft_s"] <= line["duration_s"]
    assert line["service"] == r.usage.input_tokens + 2 * 6 and line["endpoint"] == "responses"
    deltas, completed = 0, None
    with c.responses.stream(
        model="model-a", input="hello there", max_output_tokens=7, extra_headers={"X-Request-Id": "resp-2"}
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas += 1
            elif event.type == "response.completed":
                completed = event.response
    assert deltas == 7 and completed is not None and completed.usage.output_tokens == 7
    line = usage_line(fleet, "resp-2")
    assert line["outcome"] == "ok" and line["output_tokens"] == 7 and line["ttft_s"] is not None
    assert line["service"] == PRICE_A["w_p"] * completed.usage.input_tokens + PRICE_A["w_q"] * 7


def test_stateful_responses_are_refused_naming_the_field(fleet):
    c = client(fleet, "light")
    for field, value in (("previous_response_id", "resp_123"), ("background", True)):
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model="model-b", input="hi", **{field: value})
        assert e.value.body["param"] == field and field in e.value.message
    assert c.responses.create(model="model-b", input="hi", max_output_tokens=2, store=True).usage.output_tokens == 2


def test_tokenize_passes_through_authenticated_and_not_charged(fleet):
    base, h = fleet["gateway"], {"Authorization": f"Bearer {KEYS['light']}"}
    before = service(base)["light"]
    body = {"model": "model-a", "prompt": "hello fair world"}
    via = HTTP.post(base + "/tokenize", json=body, headers=h)
    direct = HTTP.post(fleet["a"] + "/tokenize", json=body)
    assert via.status_code == 200 and via.json() == direct.json() and via.json()["count"] > 0
    back = HTTP.post(base + "/detokenize", json={"model": "model-b", "tokens": via.json()["tokens"]}, headers=h)
    assert back.status_code == 200 and back.json()["prompt"] == "hello fair world"
    assert HTTP.post(base + "/tokenize", json=body).status_code == 401
    assert (
        HTTP.post(base + "/tokenize", json={**body, "model": "gpt-9"}, headers=h).json()["error"]["code"]
        == "model_not_found"
    )
    limited = {"Authorization": f"Bearer {KEYS['only-b']}"}
    assert HTTP.post(base + "/tokenize", json=body, headers=limited).status_code == 403
    assert service(base)["light"] == before  # nothing charged
    for path in ("/v1/audio/transcriptions", "/v1/rerank", "/v1/images/generations", "/pooling", "/v1/score"):
        assert HTTP.post(base + path, json=body, headers=h).status_code == 404, path  # nothing else is proxied
