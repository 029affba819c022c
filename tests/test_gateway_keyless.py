"""Keyless mode: `fairserve gateway --backend URL` with no tenants serves everyone as one tenant, `anonymous`, with
no API key checked, and says so at start; the official `openai` client gets answers with or without a key."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.processes import serve

from fairserve.api.server import free_port

pytestmark = pytest.mark.integration


def test_a_gateway_without_tenants_serves_everyone_as_one_tenant_and_warns():
    with serve("emulate", "--time-scale", "50") as backend:
        port = free_port()
        cmd = [sys.executable, "-m", "fairserve", "gateway", "--backend", backend, "--listen", f"127.0.0.1:{port}"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:  # NOTE: a condition, not a sleep: its readiness endpoint answers
                try:
                    if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "the gateway did not start"
                time.sleep(0.1)
            for key in ("sk-anything", "another"):
                client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
                done = client.completions.create(model="m", prompt="hello", max_tokens=3)
                assert done.usage is not None and done.usage.completion_tokens == 3
            bare = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
            assert bare.status_code == 200  # no Authorization header at all
            text = httpx.get(url + "/metrics", timeout=10).text
            requests = {
                (s.labels.get("tenant"), s.labels.get("outcome")): s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "fairserve_gateway_requests_total"
            }
            assert requests == {("anonymous", "ok"): 3.0}  # the three requests, one tenant
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=15)
    assert "keyless mode" in err and "'anonymous'" in err and "Traceback" not in err
