"""fairserve bench against a tiny fake OpenAI-compatible streaming server on loopback."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from fairserve.api.server import running_server
from fairserve.api.tokens import estimate_tokens
from fairserve.bench import BenchRecord, endpoint_url, resolve_keys, run_bench
from fairserve.bench.cli import add_parser, parse_keys, run
from fairserve.metrics import summarize
from fairserve.workloads import Arrival

pytestmark = pytest.mark.integration

DELAY_S = 0.02  # per output chunk
DELAYS = {"fast": 0.0, "slow": 30.0}  # by API key
FIELDS = {"client", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens", "status"}


class Fake:
    """Keys: "reject" → 429; "queued" → 503 queue_timeout; "cut" → the connection drops after 2 chunks; "short" →
    ends after 2 chunks without [DONE]; "nousage" → no usage chunk; "slow"/"fast" → other chunk delays. Usage
    reports prompt + 1000 so the tests can tell usage from the requested length."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.open = 0
        self.max_open = 0
        self.app = FastAPI()
        self.app.post("/v1/completions")(self.handle)
        self.app.post("/v1/chat/completions")(self.handle)
        self.app.get("/v1/models")(self.models)

    async def models(self, request: Request):
        if request.headers.get("authorization") == "Bearer badkey":
            return JSONResponse({"error": {"message": "bad key", "type": "invalid_request_error"}}, status_code=401)
        return {"object": "list", "data": [{"id": "m", "object": "model"}]}

    async def handle(self, request: Request):
        body = await request.json()
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        self.seen.append(
            {
                "t": time.monotonic(),
                "key": key,
                "path": request.url.path,
                "body": body,
                "client": request.headers.get("x-fairserve-client"),
            }
        )
        if key == "reject":
            return JSONResponse({"error": {"message": "slow down", "type": "rate_limit_error"}}, status_code=429)
        if key == "queued":  # the gateway's answer to a request that waited queue_ttl_s without a backend
            err = {"message": "the request waited 300 s in the queue", "type": "server_error", "code": "queue_timeout"}
            return JSONResponse({"error": err}, status_code=503)
        chat = "messages" in body
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        n, delay = body["max_tokens"], DELAYS.get(key, DELAY_S)

        def sse(obj: object) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        async def stream():
            self.open += 1
            self.max_open = max(self.max_open, self.open)
            try:
                if chat:
                    yield sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
                for i in range(n):
                    if i == 2 and key in ("cut", "short"):
                        if key == "cut":
                            raise RuntimeError("connection cut on purpose")
                        return
                    await asyncio.sleep(delay)
                    last = "length" if i == n - 1 else None
                    piece = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
                    yield sse({"choices": [{"index": 0, **piece, "finish_reason": last}]})
                if key != "nousage":
                    yield sse(
                        {
                            "choices": [],
                            "usage": {"prompt_tokens": estimate_tokens(prompt) + 1000, "completion_tokens": n},
                        }
                    )
                yield "data: [DONE]\n\n"
            finally:
                self.open -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")


class _QuietCut(logging.Filter):
    """Drops uvicorn's traceback for the deliberately cut stream, nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and "connection cut on purpose" in str(record.exc_info[1]))


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[Fake, str]]:
    f = Fake()
    log, quiet = logging.getLogger("uvicorn.error"), _QuietCut()
    log.addFilter(quiet)
    try:
        with running_server(f.app) as url:
            yield f, url
    finally:
        log.removeFilter(quiet)


def arrivals(n: int, gap_s: float, client: str = "a", output: int = 4, prompt: int = 10) -> list[Arrival]:
    return [Arrival(i * gap_s, client, prompt, output) for i in range(n)]


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


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fairserve")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", *argv])


def test_cli_table_json_and_plots(fake, tmp_path, capsys):
    _, url = fake
    trace = tmp_path / "t.csv"
    rows = [f"{i * 0.5},{'a' if i % 2 else 'b'},{12 + i},{3 + i % 3}" for i in range(8)]
    trace.write_text("arrival_time_s,client,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    out, plots = tmp_path / "bench.json", tmp_path / "plots"
    args = _parse(
        "--target",
        url,
        "--trace",
        str(trace),
        "--keys",
        "a=ka,*=kb",
        "--time-scale",
        "10",
        "--weights",
        "a=1,b=2",
        "--json",
        str(out),
        "--plots",
        str(plots),
    )
    assert run(args) == 0
    text = capsys.readouterr().out
    for word in (
        "client",
        "service",
        "svc/s",
        "resp mean",
        "p90",
        "e2e mean",
        "throughput",
        "Jain's index",
        "max service difference",
    ):
        assert word in text
    assert any(line.startswith("a ") for line in text.splitlines())
    # 3.5 workload seconds at 10x, then up to the timeout (600 s) for the last answers: the wait is part of the run
    assert "sent over about 0.35 s of wall time, then up to 600 s more for the last answers" in text
    doc = json.loads(out.read_text())
    assert set(doc) == {"summary", "requests"}
    assert set(doc["summary"]["clients"]) == {"a", "b"} and doc["summary"]["weights"] == {"a": 1.0, "b": 2.0}
    assert "jain_index" in doc["summary"] and "max_backlogged_diff" in doc["summary"]
    assert len(doc["requests"]) == 8
    for r in doc["requests"]:
        assert FIELDS <= set(r) and r["status"] == "finished" and r["http_status"] == 200
    for name in ("service_rate.png", "response_time.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_named_workload_and_errors(fake, tmp_path, capsys):
    _, url = fake
    args = _parse(
        "--target",
        url,
        "--workload",
        "overload",
        "--duration",
        "2",
        "--time-scale",
        "20",
        "--keys",
        "*=fast",
        "--endpoint",
        "chat",
    )
    assert run(args) == 0
    assert "client-0" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no API key"):
        run(_parse("--target", url, "--workload", "overload", "--duration", "2", "--keys", "client-0=k"))
    with pytest.raises(ValueError, match="trace file not found"):
        run(_parse("--target", url, "--trace", str(tmp_path / "nope.csv"), "--keys", "*=k"))
    with pytest.raises(ValueError, match="weights"):
        run(_parse("--target", url, "--workload", "overload", "--duration", "2", "--keys", "*=k", "--weights", "x"))
    with pytest.raises(SystemExit):  # --workload and --trace are exclusive
        _parse("--target", url, "--workload", "overload", "--trace", "t.csv", "--keys", "*=k")


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

    assert _parse("--target", url, "--workload", "overload", "--keys", "*=k").client_xargs is None
    assert (
        _parse("--target", url, "--workload", "overload", "--keys", "*=k", "--client-xargs").client_xargs
        == "fairserve_client"
    )
    assert (
        _parse("--target", url, "--workload", "overload", "--keys", "*=k", "--client-xargs", "tenant").client_xargs
        == "tenant"
    )


def test_cli_client_xargs_reaches_the_server(fake, capsys):
    f, url = fake
    before = len(f.seen)
    args = _parse(
        "--target",
        url,
        "--workload",
        "overload",
        "--duration",
        "1",
        "--time-scale",
        "20",
        "--keys",
        "*=fast",
        "--client-xargs",
        "tenant",
    )
    assert run(args) == 0
    seen = f.seen[before:]
    assert seen and all(s["body"]["vllm_xargs"] == {"tenant": s["client"]} for s in seen)
    assert "client-0" in capsys.readouterr().out


def test_an_unreachable_target_or_a_refused_key_is_one_error_before_the_run(fake, capsys):
    from fairserve.api.server import free_port
    from fairserve.cli import main

    _, url = fake
    common = ["--workload", "overload", "--duration", "2", "--time-scale", "20", "--no-progress"]
    nowhere = f"http://127.0.0.1:{free_port()}"
    for target, keys, message in [
        (nowhere, "*=fast", f"cannot reach the target {nowhere}"),
        (url, "client-0=fast,client-1=badkey", "refused the API key of client 'client-1'"),
    ]:
        start = time.monotonic()
        assert main(["bench", "--target", target, "--keys", keys, *common]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert time.monotonic() - start < 5  # at once, not after the workload's duration
    # with --wait: it waits for the target, then gives up with the same error
    assert main(["bench", "--target", nowhere, "--keys", "*=fast", "--wait", "0.5", *common]) == 2
    capsys.readouterr()
    f, _ = fake
    assert main(["bench", "--target", url, "--keys", "*=fast", *common]) == 0
    assert f.seen[-1]["body"]["model"] == "m"  # no --model: the one the target lists


def test_bench_places_requests_on_several_targets():
    from fairserve.bench.runner import place
    from fairserve.workloads import Arrival

    arrivals = [
        Arrival(arrival_s=t, client=c, prompt_tokens=5, output_tokens=5)
        for c, t in [("b", 0.3), ("a", 0.0), ("a", 0.1), ("b", 0.2)]
    ]
    targets = "http://r1:1,http://r2:2/v1"
    assert place(targets, arrivals, "completions") == [f"http://r{k}:{k}/v1/completions" for k in (2, 1, 2, 1)]
    pinned = place(targets, arrivals, "completions", "by-client")
    assert pinned == [f"http://r{k}:{k}/v1/completions" for k in (2, 1, 1, 2)]  # a on r1, b on r2
    with pytest.raises(ValueError, match="placement"):
        place(targets, arrivals, "completions", "random")


def test_wait_comes_before_the_admin_api_is_read(fake, monkeypatch, capsys):
    # a gateway just started answers its admin API only once it is up: --wait must come first
    import fairserve.bench.cli as bench_cli
    from fairserve.cli import main

    calls: list[str] = []
    real_preflight = bench_cli.preflight
    monkeypatch.setattr(bench_cli, "preflight", lambda *a, **k: calls.append("wait") or real_preflight(*a, **k))

    def weights_read(*args, **kwargs):
        calls.append("admin")
        raise ValueError("--admin-key: stop here")

    monkeypatch.setattr(bench_cli, "server_weights", weights_read)
    _, url = fake
    argv = ["bench", "--target", url, "--workload", "overload", "--duration", "1", "--keys", "*=k", "--no-progress"]
    assert main([*argv, "--wait", "5", "--admin-key", "adm"]) == 2
    assert calls == ["wait", "admin"] and "stop here" in capsys.readouterr().err


def test_the_plots_label_names_each_target():
    from fairserve.bench.cli import target_label

    assert target_label("http://127.0.0.1:8081,http://127.0.0.1:8082/v1") == "127.0.0.1:8081, 127.0.0.1:8082"
    assert target_label("http://gw:8080") == "gw:8080"
