"""`fairserve serve` under the same faults as the gateway: a stalled upload, stalled headers, /health for load
balancers, a protected /metrics, and costs that would overflow the accounting."""
from __future__ import annotations

import socket

import httpx
import pytest

pytest.importorskip("transformers")

from fairserve.api.server import running_server  # noqa: E402
from fairserve.serve.app import create_app  # noqa: E402
from fairserve.serve.config import load_config  # noqa: E402


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    data = b""
    while piece := sock.recv(65536):
        data += piece
    return data


def test_serve_times_out_stalled_clients_and_protects_metrics():
    cfg = load_config(overrides={"tenants": [{"name": "a", "api_keys": ["ka"]}], "num_blocks": 16, "page_size": 16,
                                 "max_batch_tokens": 64, "client_timeout_s": 0.5, "metrics_key": "mk"})
    with running_server(create_app(cfg), timeout_s=60, header_timeout_s=0.5) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ka\r\n"
                      b"content-type: application/json\r\ncontent-length: 5000\r\n\r\n{\"prompt\":")
            assert _closed_within(s, 5).startswith(b"HTTP/1.1 408")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            assert _closed_within(s, 5) == b""
        assert httpx.get(url + "/health").status_code == httpx.get(url + "/healthz").status_code == 200
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/metrics", headers={"authorization": "Bearer mk"}).status_code == 200


@pytest.mark.parametrize("key", ["w_p", "w_q"])
def test_serve_refuses_costs_that_overflow(key):
    with pytest.raises(ValueError, match=key):
        load_config(overrides={key: 1e308})
