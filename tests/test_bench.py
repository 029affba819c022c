"""`fairserve bench`'s runner against a tiny fake OpenAI-compatible streaming server on loopback: records, statuses,
timeouts, concurrency, keys."""

from __future__ import annotations

import time

import pytest
from fastapi import FastAPI
from support.fake_openai import DELAYS, FIELDS, arrivals, fake, parse_bench

from fairserve.api.server import running_server
from fairserve.api.tokens import estimate_tokens
from fairserve.bench import BenchRecord, endpoint_url, resolve_keys, run_bench
from fairserve.bench.cli import parse_keys
from fairserve.metrics import summarize
from fairserve.workloads import Arrival

pytestmark = pytest.mark.integration

__all__ = ["fake"]  # NOTE: the fixture, imported so that pytest finds it here


def test_records_fields_statuses_and_request_shape(fake):
    f, url = fake
    before = len(f.seen)
    arr = [Arrival(0.0, "a", 10, 4), Arrival(0.0, "b", 7, 3)]
    recs = run_bench(url, arr, {"a": "ka", "*": "kdefault"}, timeout_s=5)
    assert [r.status for r in recs] == ["finished", "finished"]
    assert [r.id for r in recs] == [0, 1]
    for r, a in zip(recs, arr, strict=False):
        assert isinstance(r, BenchRecord) and FIELDS <= set(r.to_dict())
        assert r.client == a.client and r.arrival_s == a.arrival_s and r.max_tokens == a.output_tokens
        assert r.output_tokens == a.output_tokens and r.prompt_tokens == a.prompt_tokens + 1000  # from usage
        assert r.http_status == 200 and r.error is None
        assert r.arrival_s <= r.first_token_s <= r.finish_s and r.admit_s == r.first_token_s
        assert r.last_token_s == r.finish_s
    seen = {s["client"]: s for s in f.seen[before:]}
    assert seen["a"]["key"] == "ka" and seen["b"]["key"] == "kdefault"
    body = seen["a"]["body"]
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 4
    assert body["stream_options"] == {"include_usage": True} and body["model"] == "fairserve-emulated"
    assert estimate_tokens(body["prompt"]) == 10 and seen["a"]["path"] == "/v1/completions"


def test_chat_without_usage_counts_chunks(fake):
    f, url = fake
    recs = run_bench(url + "/v1/", [Arrival(0.0, "c", 5, 6)], {"*": "nousage"}, endpoint="chat", timeout_s=5)
    (r,) = recs
    assert r.status == "finished" and r.output_tokens == 6 and r.prompt_tokens == 5
    assert f.seen[-1]["path"] == "/v1/chat/completions"
    assert estimate_tokens(f.seen[-1]["body"]["messages"][0]["content"]) == 5


def test_time_scale_maps_wall_to_workload_time(fake):
    f, url = fake
    before = len(f.seen)
    scale = 10.0
    arr = arrivals(3, 2.0)  # workload 0, 2, 4 s → wall 0, 0.2, 0.4 s
    t0 = time.monotonic()
    recs = run_bench(url, arr, {"a": "k"}, time_scale=scale, timeout_s=5)
    sent = [s["t"] - t0 for s in f.seen[before:]]
    # NOTE: delays only ever add: never before its scaled time, and well before the unscaled 2 s and 4 s
    assert all(t >= a.arrival_s / scale - 0.01 for t, a in zip(sent, arr, strict=False)) and sent[-1] < 2.0, sent
    for r in recs:  # 4 chunks × 20 ms wall ≥ 0.8 workload s (0.08 if unscaled)
        assert r.status == "finished"
        assert 0.7 < r.finish_s - r.arrival_s and r.first_token_s <= r.finish_s, r


def test_rejected_cut_short_and_timeout(fake):
    _, url = fake
    arr = [Arrival(0.0, c, 8, 5) for c in ("rej", "cut", "short", "slow", "ok")]
    keys = {"rej": "reject", "cut": "cut", "short": "short", "slow": "slow", "ok": "k"}
    t0 = time.monotonic()
    rej, cut, short, slow, ok = run_bench(url, arr, keys, timeout_s=1.0)
    assert time.monotonic() - t0 < DELAYS["slow"] / 2  # the timeout ended it, not the slow server
    assert rej.status == "rejected" and rej.http_status == 429 and "slow down" in rej.error
    assert rej.first_token_s is None and rej.output_tokens == 0
    for r in (cut, short):
        assert r.status == "unfinished" and r.finish_s is None and r.error
        assert r.output_tokens == 2 and r.first_token_s is not None and r.last_token_s >= r.first_token_s
    assert "[DONE]" in short.error
    assert slow.status == "unfinished" and "timed out" in slow.error and slow.first_token_s is None
    assert ok.status == "finished"


def test_a_queue_timeout_waited_so_it_is_unfinished_not_rejected(fake):
    _, url = fake
    (queued,) = run_bench(url, [Arrival(0.0, "q", 8, 5)], {"q": "queued"}, timeout_s=5.0)
    assert queued.status == "unfinished" and queued.http_status == 503 and "waited 300 s" in queued.error
    assert summarize([queued], 1.0).clients["q"].rejected == 0


def test_unreachable_target_is_rejected():
    with running_server(FastAPI()) as url:
        pass  # the port is closed again
    (r,) = run_bench(url, [Arrival(0.0, "a", 1, 1)], {"*": "k"}, timeout_s=5)
    assert r.status == "rejected" and r.http_status is None and "connect" in r.error


def test_max_inflight_caps_concurrency(fake):
    f, url = fake
    f.max_open = 0
    recs = run_bench(url, arrivals(6, 0.0), {"*": "k"}, max_inflight=2, timeout_s=5)
    assert all(r.status == "finished" for r in recs)
    assert f.max_open <= 2


def test_keys_and_validation(fake):
    f, url = fake
    before = len(f.seen)
    with pytest.raises(ValueError, match="no API key for client.*b"):
        run_bench(url, [Arrival(0.0, "a", 1, 1), Arrival(0.0, "b", 1, 1)], {"a": "k"})
    assert len(f.seen) == before  # nothing was sent
    assert resolve_keys({"a": "1", "*": "2"}, ["a", "b"]) == {"a": "1", "b": "2"}
    assert parse_keys("a=k1, *=k2,b=x=y") == {"a": "k1", "*": "k2", "b": "x=y"}
    for bad in ("a", "a=", "=k", "a=1,a=2", ""):
        with pytest.raises(ValueError):
            parse_keys(bad)
    with pytest.raises(ValueError):
        endpoint_url("localhost:8000", "completions")
    with pytest.raises(ValueError):
        endpoint_url("http://x", "embeddings")
    with pytest.raises(ValueError):
        run_bench(url, arrivals(1, 0.0), {"*": "k"}, time_scale=0)


def test_client_xargs_names_the_client_in_the_body(fake):
    f, url = fake
    before = len(f.seen)
    arr = [Arrival(0.0, "a", 5, 2), Arrival(0.0, "b", 5, 2)]
    recs = run_bench(url, arr, {"*": "fast"}, timeout_s=5, xargs_key="fairserve_client")
    assert [r.status for r in recs] == ["finished", "finished"]
    bodies = {s["client"]: s["body"] for s in f.seen[before:]}
    assert bodies["a"]["vllm_xargs"] == {"fairserve_client": "a"}
    assert bodies["b"]["vllm_xargs"] == {"fairserve_client": "b"}
    run_bench(url, arr[:1], {"*": "fast"}, timeout_s=5)
    assert "vllm_xargs" not in f.seen[-1]["body"]  # off by default

    assert parse_bench("--target", url, "--workload", "overload", "--keys", "*=k").client_xargs is None
    assert (
        parse_bench("--target", url, "--workload", "overload", "--keys", "*=k", "--client-xargs").client_xargs
        == "fairserve_client"
    )
    assert (
        parse_bench("--target", url, "--workload", "overload", "--keys", "*=k", "--client-xargs", "tenant").client_xargs
        == "tenant"
    )
