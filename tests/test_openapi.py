"""The gateway's OpenAPI description (`/openapi.json`) and a bounded schemathesis run over it: generated requests to
every operation (a fixed example budget) get no 5xx and no answer outside the description."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from support.gateway import ADMIN, HTTP, KEYS, FakeBackend, config

from fairserve.api.server import running_server
from fairserve.gateway import create_app

pytestmark = pytest.mark.integration

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = 40  # per operation, valid and invalid requests: ~11 operations, well under a minute
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def gateway_url():
    fake = FakeBackend()
    with (
        running_server(fake.app) as url,
        running_server(create_app(config([url], metrics_key="mk", health_interval_s=0.5))) as base,
    ):
        yield base


def test_openapi_json_describes_every_route(gateway_url):
    doc = HTTP.get(gateway_url + "/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/healthz",
        "/health",
        "/metrics",
        "/admin/tenants",
        "/admin/tenants/{name}/weight",
        "/admin/reset",
        "/admin/keys",
        "/admin/keys/{id}",
    } <= set(doc["paths"])


def test_schemathesis_finds_no_5xx_and_no_schema_violation(gateway_url):
    schema = schemathesis.openapi.from_url(gateway_url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9
    calls: list[int] = []

    def fuzz(op, key: str) -> None:
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy() | op.as_strategy(generation_mode=GenerationMode.NEGATIVE))
        def run(case) -> None:
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}"}
            calls.append(case.call_and_validate(base_url=gateway_url, checks=CHECKS, timeout=30).status_code)

        run()  # a failing check raises, with the case to reproduce it

    for op in operations:
        fuzz(op, ADMIN if op.path.startswith("/admin") else "mk" if op.path == "/metrics" else KEYS["alice"])
    assert len(calls) > 100 and 200 in calls and 400 in calls, calls
