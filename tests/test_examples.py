"""The example configurations in examples/ load as they are (a typo in one fails here, not on a user's machine)."""

import tomllib
from pathlib import Path

import pytest

from fairserve.gateway.settings.config import load_config as load_gateway
from fairserve.serve.config import load_config as load_serve

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_gateway_example():
    cfg = load_gateway(EXAMPLES / "gateway.toml")
    assert [t.name for t in cfg.tenants] == ["search", "chatbot", "batch"] and cfg.weights()["search"] == 2
    assert len(cfg.backends) == 2 and cfg.metrics_key and cfg.state is None


def test_the_replicas_example():
    cfg = load_gateway(EXAMPLES / "replicas.toml", {"listen": "127.0.0.1:8082"})
    assert cfg.state == "redis://127.0.0.1:6379/0" and cfg.listen == "127.0.0.1:8082"


def test_the_serve_example():
    cfg = load_serve(EXAMPLES / "serve.toml")
    assert cfg.model == "tiny-random" and cfg.num_blocks * cfg.page_size == 16384 and len(cfg.tenants) == 2


def test_the_tree_example_for_the_gateway_and_serve():
    cfg = load_gateway(EXAMPLES / "tree.toml")
    assert max(t.name.count("/") for t in cfg.tenants) == 2  # three levels: tier / organisation / tenant
    assert cfg.priorities() == {"premium": 0, "free": 1} and cfg.weights()["premium/acme"] == 2
    assert cfg.level_of("free/bob") == 1 and cfg.named_allowed("premium/acme/search") == [0, 1]
    assert cfg.engine_env(cfg.policy, cfg.w_p, cfg.w_q)["FAIRSERVE_ALLOWED_PRIORITIES"] == "premium/acme/search=0|1"
    # the same tree in `fairserve serve`: its keys without the gateway's
    text = (EXAMPLES / "tree.toml").read_text().replace("backends = ", "# backends = ")
    served = load_serve(None, {k: v for k, v in tomllib.loads(text).items() if k not in ("listen",)})
    assert served.weights() == cfg.weights() and served.priorities() == cfg.priorities()


def test_every_example_is_tested():
    assert {p.name for p in EXAMPLES.glob("*.toml")} == {"gateway.toml", "replicas.toml", "serve.toml", "tree.toml"}


def test_a_backend_takes_the_flags_names_in_toml_too(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text(
        'tenants = [{ name = "a", api_keys = ["k"] }]\n'
        'backends = [{ url = "http://127.0.0.1:8001", max_requests = 5, max_tokens = 900 }]\n'
    )
    backend = load_gateway(path).backends[0]
    assert (backend.max_inflight_requests, backend.max_inflight_tokens) == (5, 900)
