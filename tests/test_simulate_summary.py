"""`fairserve simulate`'s summary counts service under the cost function the run charged."""

import json

import pytest

from fairserve.cli import main
from fairserve.core.cost import make_cost

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("cost", ["profiled", "linear"])
def test_summary_service_uses_the_runs_cost(tmp_path, cost):
    out = tmp_path / "run.json"
    assert (
        main(
            [
                "simulate",
                "--workload",
                "overload",
                "--duration",
                "60",
                "--policy",
                "vtc",
                "--cost",
                cost,
                "--w-q",
                "3",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    h = make_cost(cost, 1.0, 3.0)
    for client, stats in doc["summary"]["clients"].items():
        served = [r for r in doc["requests"] if r["client"] == client and r["first_token_s"] is not None]
        assert stats["service"] == pytest.approx(sum(h.total(r["prompt_tokens"], r["output_tokens"]) for r in served))
