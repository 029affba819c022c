"""deploy/grafana/fairserve.json asks only for metrics the servers export; `fairserve serve` has the dashboard too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient
from support.gateway import HTTP, FakeBackend, auth, chat_body, serve

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "fairserve.json").read_text())
METRIC = re.compile(r"\bfairserve_[a-z_]+\b")


def queries() -> list[str]:
    return [t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", [])]


def exported(text: str) -> tuple[set[str], set[str]]:
    """(sample names, e.g. x_total and x_bucket; family names as the exposition's HELP lines give them)."""
    families = list(text_string_to_metric_families(text))
    samples = {s.name for f in families for s in f.samples}
    names = set(re.findall(r"^# HELP (\S+)", text, re.M))
    return samples, names


@pytest.fixture(scope="module")
def serve_app():
    pytest.importorskip("transformers")
    from fairserve.serve.app import create_app
    from fairserve.serve.config import load_config

    cfg = load_config(
        overrides={
            "tenants": [{"name": "alice", "api_keys": ["ka"], "weight": 3}, {"name": "bob", "api_keys": ["kb"]}],
            "admin_key": "adm",
            "num_blocks": 16,
            "page_size": 16,
            "max_batch_tokens": 64,
        }
    )
    return TestClient(create_app(cfg))  # NOTE: no lifespan: the engine is built but not started


def test_every_query_names_exported_metrics(serve_app):
    with serve(FakeBackend()) as base:
        # NOTE: a tenant's series appear with its first request (docs/gateway.md, Metrics)
        for tenant in ("alice", "bob"):
            assert HTTP.post(base + "/v1/chat/completions", json=chat_body(2), headers=auth(tenant)).status_code == 200
        gateway_samples, gateway_names = exported(HTTP.get(base + "/metrics").text)
    serve_samples, serve_names = exported(serve_app.get("/metrics").text)
    used = {m for q in queries() for m in METRIC.findall(q)}
    assert {m for m in used if m.startswith("fairserve_gateway_")} and {
        m for m in used if m.startswith("fairserve_serve_")
    }
    unknown = used - gateway_samples - serve_samples
    assert not unknown, f"the Grafana dashboard queries metrics no server exports: {sorted(unknown)}"
    # every family `fairserve serve` exports is on the dashboard, and every per-tenant one of the gateway
    assert all(any(m == n or m.startswith(n + "_") for m in used) for n in serve_names), serve_names
    shared = {n.replace("fairserve_serve_", "fairserve_gateway_") for n in serve_names}
    assert shared <= gateway_names


def test_dashboard_json_is_well_formed():
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)) and DASHBOARD["uid"] == "fairserve"
    assert {v["name"] for v in DASHBOARD["templating"]["list"]} == {"datasource", "job"}
    for p in DASHBOARD["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"] and p["title"]
    for q in queries():
        assert q.count("(") == q.count(")") and 'job=~"$job"' in q, q
    scrape = (ROOT / "deploy" / "prometheus.yml").read_text()
    assert "scrape_configs:" in scrape and "fairserve-gateway" in scrape and "fairserve-serve" in scrape


def test_serve_has_the_dashboard(serve_app):
    page = serve_app.get("/dashboard")
    assert page.status_code == 200 and "alice" not in page.text
    assert serve_app.get("/admin/dashboard", headers={"Authorization": "Bearer kb"}).status_code == 403
    doc = serve_app.get("/admin/dashboard", headers={"Authorization": "Bearer adm"}).json()
    assert [(t["name"], t["weight"]) for t in doc["tenants"]] == [("alice", 3.0), ("bob", 1.0)]
    assert doc["backends"] is None and doc["policy"] == "vtc"
