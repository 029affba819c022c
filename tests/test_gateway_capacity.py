"""Adaptive capacity (gateway/dispatch/capacity.py): reading vLLM, SGLang and llama.cpp /metrics, the AIMD rule, the
scrape loop on a scheduler, the flags, and the limit adapting in a running gateway (a fake backend, then the emulator).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading

import httpx
import pytest
from fastapi.responses import PlainTextResponse
from support.gateway import (
    HTTP,
    FakeBackend,
    auth,
    chat_body,
    config,
    metric,
    serve,
    wait_until,
)
from support.processes import serve as serve_process

from fairserve.gateway.admission.footprint import Footprint
from fairserve.gateway.admission.scheduler import Scheduler
from fairserve.gateway.admission.ticket import Ending
from fairserve.gateway.cli import add_parser, config_from_args
from fairserve.gateway.dispatch.capacity import CapacityMonitor, Reading, next_limit, parse_metrics
from fairserve.gateway.metrics.prometheus import GatewayMetrics
from fairserve.gateway.settings.backends import parse_backend

pytestmark = pytest.mark.integration

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="m"} 1234.0
"""
VLLM_OLD = (
    'vllm:num_requests_running{model_name="m"} 4\nvllm:num_requests_waiting{model_name="m"} 0\n'
    'vllm:gpu_cache_usage_perc{model_name="m"} 0.97\n'
)
SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 5.0
sglang:num_running_reqs{model_name="m",tp_rank="1"} 6.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 0.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.25
"""
LLAMACPP = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""
UNKNOWN = "# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total 3.5\n"


def vllm_text(running: int, waiting: int) -> str:
    return (
        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
    )


# ---- reading each server ----------------------------------------------------------------------------------------
def test_readings_of_vllm_sglang_and_llamacpp():
    assert parse_metrics(VLLM) == Reading("vllm", 3.0, 7.0, 0.5)
    assert parse_metrics(VLLM_OLD) == Reading("vllm", 0.0, 4.0, 0.97)  # the older KV-cache name
    assert parse_metrics(SGLANG) == Reading("sglang", 0.0, 11.0, 0.25)  # ranks summed
    assert parse_metrics(LLAMACPP) == Reading("llama.cpp", 1.0, 2.0, None)
    assert parse_metrics(VLLM).congested and parse_metrics(VLLM_OLD).congested  # waiting; KV above 0.95
    assert not parse_metrics(SGLANG).congested and parse_metrics(LLAMACPP).congested


def test_unknown_or_malformed_metrics_give_no_reading():
    assert parse_metrics(UNKNOWN) is None
    assert parse_metrics("") is None
    assert parse_metrics('vllm:num_requests_waiting{model_name="m"} 3\n') is None  # no running: not enough
    assert parse_metrics("<html>not prometheus {{{</html>") is None


# ---- the rule -----------------------------------------------------------------------------------------------------
def congested(running: int, waiting: int = 2) -> Reading:
    return Reading("vllm", waiting, running)


def test_decrease_toward_running_at_most_halving_at_least_one():
    assert next_limit(32, 32, congested(20), in_flight=32, backlog=0) == 20  # to what the backend runs
    assert next_limit(32, 32, congested(2), in_flight=32, backlog=0) == 16  # at most halved
    assert next_limit(5, 32, congested(10), in_flight=5, backlog=0) == 4  # at least 1 lower
    assert next_limit(1, 32, congested(0), in_flight=1, backlog=5) == 1  # never below 1
    kv_full = Reading("sglang", 0, 16, 0.99)
    assert next_limit(16, 32, kv_full, in_flight=16, backlog=9) == 15  # KV high-water is congestion too


def test_no_second_decrease_while_the_excess_drains():
    assert next_limit(20, 32, congested(20), in_flight=30, backlog=4) == 20


def test_increase_only_when_full_at_the_limit_with_a_gateway_backlog():
    calm = Reading("llama.cpp", 0, 4)
    assert next_limit(4, 32, calm, in_flight=4, backlog=1) == 5
    assert next_limit(4, 32, calm, in_flight=4, backlog=0) == 4  # nothing waits in the gateway
    assert next_limit(4, 32, calm, in_flight=3, backlog=7) == 4  # the backend has room already
    assert next_limit(32, 32, calm, in_flight=32, backlog=7) == 32  # never above the configured max


def test_no_reading_means_the_static_limit():
    assert next_limit(3, 32, None, in_flight=3, backlog=10) == 32


# ---- the scrape loop on a scheduler (no network: a mock transport) ------------------------------------------------
def scheduler(**backend) -> Scheduler:
    metrics = GatewayMetrics()
    s = Scheduler(config([{"url": "http://a", "max_inflight_requests": 8, "adaptive": True, **backend}]), metrics)
    metrics.bind(s)
    return s


def monitor(s: Scheduler, texts: list[str], seen: list[str] | None = None) -> CapacityMonitor:
    """A monitor whose scrapes answer the next of `texts` ("" = a connection error)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(str(request.url))
        text = texts.pop(0)
        if not text:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, text=text)

    return CapacityMonitor(s, httpx.AsyncClient(transport=httpx.MockTransport(answer)), interval_s=1.0)


def test_scrapes_set_the_limit_and_a_raise_dispatches():
    async def go() -> None:
        s = scheduler()
        tickets = [s.new_ticket("alice", Footprint(5, 5)) for _ in range(10)]
        for t in tickets:
            s.submit(t)
        b, seen = s.backends[0], []
        assert b.limit == 8 and b.requests == 8 and s.ledger.num_queued == 2
        m = monitor(s, [vllm_text(3, 5), vllm_text(3, 5), vllm_text(4, 0)], seen)
        await m.step()
        assert b.limit == 4 and seen == ["http://a/metrics"]  # max(running 3, 8 / 2)
        for t in tickets[:5]:
            s.close(t, Ending("ok"))
        assert b.requests == 4 and s.ledger.num_queued == 1  # one queued ticket took a freed slot, not two
        await m.step()
        assert b.limit == 3  # still congested, 4 in flight: lower again
        s.close(tickets[5], Ending("ok"))
        await m.step()  # calm, full at 3, 1 queued: raise, dispatch
        assert b.limit == 4 and b.requests == 4 and s.ledger.num_queued == 0

    asyncio.run(go())


def test_scrape_failure_keeps_the_static_limit_and_logs_once(caplog):
    async def go() -> None:
        s = scheduler(metrics_url="http://a:9100/custom", api_key="sk-up")
        b, seen = s.backends[0], []
        m = monitor(s, [vllm_text(1, 9), "", UNKNOWN, "", vllm_text(1, 9)], seen)
        await m.step()
        assert b.limit == 4
        for _ in range(3):
            await m.step()
            assert b.limit == 8
        await m.step()
        assert b.limit == 4 and seen == ["http://a:9100/custom"] * 5

    with caplog.at_level(logging.INFO, logger="fairserve.gateway"):
        asyncio.run(go())
    assert len([r for r in caplog.records if "no reading" in r.message]) == 1
    assert len([r for r in caplog.records if "reading vllm metrics" in r.message]) == 1


# ---- configuration ------------------------------------------------------------------------------------------------
def test_backend_option_and_interval_flag():
    assert parse_backend("http://a:8000,adaptive=1,max_requests=16") == {
        "url": "http://a:8000",
        "adaptive": True,
        "max_inflight_requests": 16,
    }
    assert parse_backend("http://a,adaptive=off,metrics_url=http://a:9/m")["adaptive"] is False
    with pytest.raises(ValueError, match="adaptive"):
        parse_backend("http://a,adaptive=maybe")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "gateway",
            "--backend",
            "http://a,adaptive=1,metrics_url=http://a:9/m",
            "--tenant",
            "t:k",
            "--metrics-interval",
            "0.25",
        ]
    )
    cfg = config_from_args(args)
    assert cfg.metrics_interval_s == 0.25
    assert cfg.backends[0].adaptive and cfg.backends[0].metrics_url == "http://a:9/m"
    with pytest.raises(ValueError, match="metrics_url"):
        config([{"url": "http://a", "metrics_url": "a:9/m"}])
    assert not config(["http://a"]).backends[0].adaptive and config(["http://a"]).metrics_interval_s == 1.0


# ---- a running gateway --------------------------------------------------------------------------------------------
def limits(base: str) -> list[int]:
    return [b["limit_requests"] for b in HTTP.get(base + "/healthz").json()["backends"]]


def test_limit_adapts_in_a_running_gateway():
    fake = FakeBackend(delay_s=0.02)
    text = {"now": vllm_text(2, 6)}

    @fake.app.get("/metrics")
    async def backend_metrics():
        return PlainTextResponse(text["now"])

    with serve(fake, backend_options={"max_inflight_requests": 8, "adaptive": True}, metrics_interval_s=0.02) as gw:
        assert wait_until(lambda: limits(gw) == [1])  # congested without end: down to 1
        assert metric(gw, "fairserve_gateway_backend_limit_requests", backend=fake_url(gw)) == 1
        text["now"] = vllm_text(1, 0)  # calm: the limit grows with the backlog
        results: list[int] = []

        def client(i: int) -> None:
            r = HTTP.post(gw + "/v1/chat/completions", json=chat_body(10), headers=auth("alice" if i % 2 else "bob"))
            results.append(r.status_code)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        assert wait_until(lambda: limits(gw)[0] >= 3, timeout_s=20)
        for t in threads:
            t.join()
        assert results == [200] * 24


def fake_url(gw: str) -> str:
    return HTTP.get(gw + "/healthz").json()["backends"][0]["url"]


def test_emulator_queue_lowers_the_limit():
    """The emulator's KV cache holds two of these requests; with 8 sent at once the rest queue in it, and the
    gateway, reading vllm:num_requests_waiting, lowers its limit for this backend."""
    with serve_process("emulate", "--time-scale", "10", "--kv-tokens", "600") as emulator:
        gateway = serve_process(
            "gateway",
            "--backend",
            f"{emulator},max_requests=8,adaptive=1",
            "--metrics-interval",
            "0.02",
            "--tenant",
            "alice:key-alice",
        )
        with gateway as gw:
            results: list[int] = []

            def client() -> None:
                r = HTTP.post(gw + "/v1/chat/completions", json=chat_body(250), headers=auth("alice"), timeout=60)
                results.append(r.status_code)

            threads = [threading.Thread(target=client) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert results == [200] * 8
            # NOTE: raising needs a gateway backlog, and there is none left: the lowered limit stands
            assert limits(gw)[0] < 8
            assert 0 < metric(gw, "fairserve_gateway_backend_limit_requests", backend=emulator) < 8
