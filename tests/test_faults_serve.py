"""`fairserve serve` under the same faults as the gateway: a stalled upload, stalled headers, /health for load
balancers, a protected /metrics, and costs that would overflow the accounting."""

from __future__ import annotations

import httpx
import pytest
from support.raw_sockets import closed_within, connect

pytestmark = pytest.mark.integration

pytest.importorskip("transformers")

from fairserve.api.server import running_server  # noqa: E402
from fairserve.serve.app import create_app  # noqa: E402
from fairserve.serve.config import load_config  # noqa: E402


def test_serve_times_out_stalled_clients_and_protects_metrics():
    cfg = load_config(
        overrides={
            "tenants": [{"name": "a", "api_keys": ["ka"]}],
            "num_blocks": 16,
            "page_size": 16,
            "max_batch_tokens": 64,
            "client_timeout_s": 0.5,
            "metrics_key": "mk",
        }
    )
    with running_server(create_app(cfg), timeout_s=60, header_timeout_s=0.5) as url:
        with connect(url) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ka\r\n"
                b'content-type: application/json\r\ncontent-length: 5000\r\n\r\n{"prompt":'
            )
            assert closed_within(s, 5).startswith(b"HTTP/1.1 408")
        with connect(url) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            assert closed_within(s, 5) == b""
        assert httpx.get(url + "/health").status_code == httpx.get(url + "/healthz").status_code == 200
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/metrics", headers={"authorization": "Bearer mk"}).status_code == 200


@pytest.mark.parametrize("key", ["w_p", "w_q"])
def test_serve_refuses_costs_that_overflow(key):
    with pytest.raises(ValueError, match=key):
        load_config(overrides={key: 1e308})


def test_serve_drain_ends_what_is_left_with_an_error_charged_what_was_produced():
    """SIGTERM: in-flight requests get drain_timeout_s; a stream still running then ends with an error event
    (code "shutdown") after the tokens it got, a non-streamed request with a 503, and both are settled."""
    import json
    import threading
    import time

    from fairserve.api.server import running

    cfg = load_config(
        overrides={
            "tenants": [{"name": "a", "api_keys": ["ka"]}],
            "num_blocks": 512,
            "page_size": 32,
            "max_batch_tokens": 64,
        }
    )
    app = create_app(cfg)
    body = {"model": "tiny-random", "prompt": "the quick brown fox", "max_tokens": 8000, "ignore_eos": True}
    got: dict[str, object] = {"text": "", "events": []}

    def stream(base: str) -> None:
        with (
            httpx.Client(timeout=60) as c,
            c.stream(
                "POST", base + "/v1/completions", headers={"authorization": "Bearer ka"}, json={**body, "stream": True}
            ) as r,
        ):
            got["stream_status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    doc = json.loads(line[6:])
                    got["events"].append(doc)
                    got["text"] += "".join(ch.get("text") or "" for ch in doc.get("choices") or ())
                elif line == "data: [DONE]":
                    got["done"] = True

    def whole(base: str) -> None:
        r = httpx.post(base + "/v1/completions", headers={"authorization": "Bearer ka"}, json=body, timeout=60)
        got["whole"] = (r.status_code, r.json())

    with running(app, timeout_s=60, drain_timeout_s=0.2) as (base, server):
        threads = [threading.Thread(target=f, args=(base,), daemon=True) for f in (stream, whole)]
        for t in threads:
            t.start()
        queue = app.state.engine.queue

        def both_in_engine() -> bool:  # NOTE: the stream's tokens alone do not say the other request has arrived
            a = queue.view().tenants["a"]
            return a.queued + a.running == 2

        deadline = time.monotonic() + 30
        while (len(got["events"]) < 3 or not both_in_engine()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(got["events"]) >= 3 and both_in_engine(), got
        server.should_exit = True  # what SIGTERM does
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads)
    tenant = queue.view().tenants["a"]  # the server has stopped, and its engine
    assert got["stream_status"] == 200 and "done" not in got
    assert got["events"][-1]["error"]["code"] == "shutdown"
    assert got["whole"][0] == 503 and got["whole"][1]["error"]["code"] == "shutdown"
    assert len(queue) == 0 and tenant.running == 0 and tenant.queued == 0
    # both were charged their prompts and what they produced, not the 8,000 tokens they asked for
    assert 2 * (len(got["events"]) - 1) <= tenant.service < 2 * 8000


def test_serve_takes_the_gateways_timeout_and_metrics_flags(tmp_path):
    import argparse

    from fairserve.serve.cli import add_parser, config_from_args

    parser = argparse.ArgumentParser(prog="fairserve")
    add_parser(parser.add_subparsers(dest="cmd"))
    toml = tmp_path / "serve.toml"
    toml.write_text("client_timeout_s = 7.0\ndrain_timeout_s = 9.0\n")
    cfg = config_from_args(
        parser.parse_args(
            ["serve", "--config", str(toml), "--drain-timeout", "2.5", "--metrics-key", "mk", "--tenant", "a:ka"]
        )
    )
    assert (cfg.client_timeout_s, cfg.drain_timeout_s, cfg.metrics_key) == (7.0, 2.5, "mk")  # flags over the file
    with pytest.raises(ValueError, match="drain_timeout_s"):
        config_from_args(parser.parse_args(["serve", "--drain-timeout", "-1"]))
