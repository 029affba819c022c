"""`fairserve emulate`: the OpenAI-compatible real-time emulator (loopback servers only)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairserve.api.server import running_server
from fairserve.api.tokens import MESSAGE_TOKENS, OUTPUT_PIECE, estimate_tokens
from fairserve.core import RequestState
from fairserve.emulate import EmulatorConfig, Fault, create_app
from fairserve.emulate.cli import add_parser, address, config_from_args, run
from fairserve.emulate.config import FaultDraw
from fairserve.emulate.driver import MIN_SLEEP_S
from fairserve.sim import get_latency_model

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox jumps over the lazy dog, twice."  # 13 estimated tokens


@contextlib.contextmanager
def emulator(**config):
    app = create_app(EmulatorConfig(**config))
    with running_server(app) as url:
        yield url, app.state.emulator


def eventually(check, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


def events(response: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]


def test_openai_client_completions_and_chat():
    with emulator(time_scale=50) as (url, em):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list()] == ["fairserve-emulated"]
        r = client.completions.create(model="any-model", prompt=PROMPT, max_tokens=7)
        assert (r.object, r.model, r.choices[0].text) == ("text_completion", "any-model", OUTPUT_PIECE * 7)
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (estimate_tokens(PROMPT), 7)
        assert r.usage.total_tokens == estimate_tokens(PROMPT) + 7 and r.choices[0].finish_reason == "length"
        c = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=5)
        assert c.object == "chat.completion" and c.choices[0].message.content == OUTPUT_PIECE * 5
        assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (estimate_tokens(PROMPT) + MESSAGE_TOKENS, 5)
        chunks = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=9, stream=True))
        assert [ch.choices[0].text for ch in chunks] == [OUTPUT_PIECE] * 9 and chunks[-1].usage is None
        chunks = list(
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1]) == OUTPUT_PIECE * 6
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
        assert em.outcomes["finished"] == 4


def test_raw_streams_shapes_usage_and_done():
    with emulator(time_scale=50) as (url, em), httpx.Client(base_url=url) as http:
        body = {"model": "m", "prompt": [PROMPT], "max_tokens": 12, "stream": True}
        with http.stream("POST", "/v1/completions", json=body, headers={"X-Fairserve-Client": "alice"}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            data = events(r)
        assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
        chunks = [json.loads(d) for d in data[:-1]]
        assert len(chunks) == 12 and all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
        assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 11 + ["length"]
        assert em.jobs[chunks[0]["id"]].req.tenant == "alice"
        body = {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            data = events(r)
        chunks = [json.loads(d) for d in data[:-1]]
        assert data[-1] == "[DONE]" and chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]] == [OUTPUT_PIECE] * 3
        p = estimate_tokens(PROMPT) + MESSAGE_TOKENS  # one message: its role markers
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
            "prompt_tokens": p,
            "completion_tokens": 3,
            "total_tokens": p + 3,
        }
        assert em.jobs[chunks[0]["id"]].req.tenant == "anonymous"
        defaults = http.post("/v1/completions", json={"prompt": ""}).json()
        assert defaults["usage"]["completion_tokens"] == 16 and defaults["usage"]["prompt_tokens"] == 1
        chat = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "max_completion_tokens": 4},
        ).json()
        assert chat["usage"]["completion_tokens"] == 4 and chat["model"] == "fairserve-emulated"
        assert http.get("/healthz").json()["status"] == "ok"


def test_concurrent_requests_all_complete():
    async def main(url: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            rs = await asyncio.gather(
                *(http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 10 + i}) for i in range(8))
            )
        return [r.json()["usage"]["completion_tokens"] for r in rs]

    with emulator(time_scale=5, engine_mode="paged") as (url, em):
        assert asyncio.run(main(url)) == [10 + i for i in range(8)]
        assert em.outcomes["finished"] == 8
        assert em.engine.step < sum(range(9, 17))  # batched: fewer decode steps than one request at a time


def test_simulated_time_follows_wall_time_times_scale():
    model = get_latency_model("a10g-llama2-7b")
    for scale, max_tokens in ((100.0, 256), (1.0, 16)):
        with emulator(time_scale=scale) as (url, em):
            start = time.monotonic()
            rid = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": max_tokens}).json()["id"]
            wall = time.monotonic() - start
            # NOTE: the preset's server tokenizes a prompt into a few more tokens than the client counted
            req, p = em.jobs[rid].req, estimate_tokens(PROMPT) + em.engine.config.prompt_extra_tokens
            sim = model.prefill_s([p]) + sum(model.decode_step_s(1, p + g) for g in range(1, max_tokens))
            assert req.finish_s - req.arrival_s == pytest.approx(sim)
            assert wall >= 0.8 * sim / scale  # paced: never ahead of the scaled clock
            if scale > 1:
                assert wall < sim / 5  # much faster than the profiled GPU (100x expected: a wide margin)


def test_each_token_is_handed_over_at_its_simulated_time():
    """The delivery contract (emulate/driver.py): a token reaches its handler no more than MIN_SLEEP_S before
    start + its simulated time / time_scale, and, while the driver keeps up, within a few ms after."""
    scale, max_tokens = 2.0, 40
    model = get_latency_model("a10g-llama2-7b")
    with emulator(time_scale=scale) as (url, em):
        seen = []
        hand = em._hand

        def record(job, produced):
            if produced > job.delivered:
                seen.append((time.monotonic(), job.delivered, produced))
            hand(job, produced)

        em._hand = record
        rid = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": max_tokens}).json()["id"]
        req, p = em.jobs[rid].req, estimate_tokens(PROMPT) + em.engine.config.prompt_extra_tokens
    token_s = [req.first_token_s]  # the simulated time of each token: the end of the step that produced it
    for g in range(1, max_tokens):
        token_s.append(token_s[-1] + model.decode_step_s(1, p + g))
    assert token_s[-1] == pytest.approx(req.finish_s)
    due = [em._start + s / scale for s in token_s]
    assert sum(produced - before for _, before, produced in seen) == max_tokens
    assert all(t >= due[produced - 1] - MIN_SLEEP_S - 1e-4 for t, _, produced in seen)  # never early
    late = sorted(t - due[k] for t, before, produced in seen for k in range(before, produced))
    assert late[len(late) // 2] < 0.010  # NOTE: the median: a loaded machine may delay a few wake-ups


def test_disconnect_cancels_in_the_engine():
    with emulator(time_scale=1) as (url, em), httpx.Client(base_url=url) as http:
        body = {"prompt": PROMPT, "max_tokens": 500, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
            assert len(em.engine.running) == 1
        assert eventually(lambda: em.cancelled == 1)
        job = em.jobs[first["id"]]
        assert job.outcome == "cancelled" and job.req.state is RequestState.ABORTED
        assert job.req not in em.engine.running and 1 <= em.produced(job.id) < 500
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 500}, timeout=0.3)
        assert eventually(lambda: em.cancelled == 2) and em.outcomes["cancelled"] == 2
        assert not em.engine.running and em.engine.ledger.num_queued == 0


def test_fault_error_and_extra_latency():
    with emulator(time_scale=50, error_rate=1.0) as (url, em):
        r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert em.outcomes["error"] == 1 and not em.jobs
    with emulator(time_scale=100, extra_latency_s=0.3) as (url, em):
        start = time.monotonic()
        assert httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}).status_code == 200
        assert time.monotonic() - start >= 0.3


def test_fault_drop_closes_after_half_the_tokens():
    with emulator(time_scale=5, drop_rate=1.0) as (url, em), httpx.Client(base_url=url) as http:
        data: list[str] = []
        body = {"prompt": PROMPT, "max_tokens": 60, "stream": True}
        with pytest.raises(httpx.RemoteProtocolError), http.stream("POST", "/v1/completions", json=body) as r:
            data.extend(r.iter_lines())
        chunks = [json.loads(d[6:]) for d in data if d.startswith("data: ")]
        assert len(chunks) == 30 and "data: [DONE]" not in data
        with pytest.raises(httpx.RemoteProtocolError):
            http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 60})
        assert eventually(lambda: em.outcomes["dropped"] == 2) and em.cancelled == 2
        assert all(em.produced(job.id) < 60 for job in em.jobs.values()) and not em.engine.running


def test_fault_hang_until_the_client_leaves():
    with emulator(time_scale=1, hang_rate=1.0) as (url, em):
        for stream in (False, True):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(
                    url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 500, "stream": stream}, timeout=0.3
                )
        assert eventually(lambda: em.outcomes["hung"] == 2 and em.cancelled == 2)
        assert not em.engine.running and em.outcomes["finished"] == 0


def test_fault_draw_is_seeded():
    config = EmulatorConfig(error_rate=0.2, hang_rate=0.2, drop_rate=0.3, seed=7)
    a, b = FaultDraw(config), FaultDraw(config)
    draws = [a() for _ in range(200)]
    assert draws == [b() for _ in range(200)] and set(draws) == set(Fault)
    never = FaultDraw(EmulatorConfig())
    assert all(never() is Fault.NONE for _ in range(50))


BAD = [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", b""),
    ("/v1/completions", {"max_tokens": 4}),
    ("/v1/completions", {"prompt": [1, 2, 3]}),
    ("/v1/completions", {"prompt": ["a", "b"]}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}),
    ("/v1/completions", {"prompt": "a", "max_tokens": "8"}),
    ("/v1/completions", {"prompt": "a", "max_tokens": True}),
    ("/v1/completions", {"prompt": "a", "n": 2}),
    ("/v1/completions", {"prompt": "a", "stream": "yes"}),
    ("/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "a", "model": 3}),
    ("/v1/chat/completions", {"max_tokens": 4}),
    ("/v1/chat/completions", {"messages": "hi"}),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 10_000}),
]


def test_bad_requests_get_openai_400s():
    with emulator(time_scale=50) as (url, em), httpx.Client(base_url=url) as http:
        for path, body in BAD:
            r = http.post(path, content=body) if isinstance(body, bytes) else http.post(path, json=body)
            error = r.json()["error"]
            assert r.status_code == 400 and error["type"] == "invalid_request_error" and error["message"], body
        r = http.post("/v1/completions", json={"prompt": "a" * 400, "max_tokens": 9_950})
        assert "KV cache" in r.json()["error"]["message"]
        r = http.post("/v1/completions", json={"prompt": "a", "n": 2})
        assert r.json()["error"]["message"] == "Only n=1 is supported." and r.json()["error"]["param"] == "n"
        for huge in (10**30, 10**400):
            r = http.post("/v1/completions", content=b'{"prompt": "a", "max_tokens": %d}' % huge)
            assert r.status_code == 400 and "too large" in r.json()["error"]["message"]
        assert not em.jobs and sum(em.outcomes.values()) == 0


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {
        s.name + "".join(f"{{{v}}}" for v in s.labels.values() if s.name.startswith("fairserve")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_metrics_expose_vllm_names_and_count():
    with emulator(time_scale=1) as (url, em), httpx.Client(base_url=url) as http:
        before = scrape(url)
        assert before["vllm:generation_tokens_total"] == 0
        assert before["fairserve_emulator_requests_total{finished}"] == 0
        http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
        http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2})
        with http.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 500, "stream": True}) as r:
            lines = r.iter_lines()  # (a discarded iterator would close the stream)
            next(lines)
            during = scrape(url)
        assert during["vllm:num_requests_running"] == 1 and 0 < during["vllm:gpu_cache_usage_perc"] < 1
        assert during["vllm:num_requests_waiting"] == 0
        assert eventually(lambda: scrape(url)["fairserve_emulator_cancelled_total"] == 1)
        after = scrape(url)
        assert after["fairserve_emulator_requests_total{finished}"] == 2
        assert after["fairserve_emulator_requests_total{cancelled}"] == 1
        assert after["vllm:prompt_tokens_total"] == 3 * estimate_tokens(PROMPT) + MESSAGE_TOKENS  # one chat
        assert after["vllm:generation_tokens_total"] == 5 + em.jobs[list(em.jobs)[-1]].delivered


def test_config_and_cli_validation():
    for bad in (
        {"time_scale": 0},
        {"error_rate": -0.1},
        {"hang_rate": 1.5},
        {"extra_latency_s": -1},
        {"profile": "no-such-gpu"},
        {"policy": "nope"},
        {"engine_mode": "lazy"},
        {"kv_tokens": 1},
    ):
        with pytest.raises(ValueError):
            EmulatorConfig(**bad)
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["emulate", "--time-scale", "10", "--drop-rate", "0.5", "--seed", "3"])
    config = config_from_args(args)
    assert (config.time_scale, config.drop_rate, config.seed, config.kv_tokens) == (10.0, 0.5, 3, 10_000)
    assert (address(args), config.policy) == (("127.0.0.1", 8001), "fcfs")
    assert address(parser.parse_args(["emulate", "--listen", "0.0.0.0:9000"])) == ("0.0.0.0", 9000)
    assert address(parser.parse_args(["emulate", "--listen", "[::1]:9000"])) == ("::1", 9000)
    assert address(parser.parse_args(["emulate", "--port", "9001"])) == ("127.0.0.1", 9001)  # the old flags
    assert address(parser.parse_args(["emulate", "--host", "0.0.0.0", "--port", "0"])) == ("0.0.0.0", 0)
    for bad in (["--listen", "8001"], ["--listen", "host:port"], ["--port", "70000"]):
        with pytest.raises(ValueError, match="--listen must be HOST:PORT|port must be between"):
            run(parser.parse_args(["emulate", *bad]))
    with pytest.raises(ValueError, match="drop_rate"):
        run(parser.parse_args(["emulate", "--drop-rate", "2"]))
    with pytest.raises(ValueError, match="unknown policy"):
        run(parser.parse_args(["emulate", "--policy", "nope"]))
