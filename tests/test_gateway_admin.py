"""The admin API, config validation (one line naming the key), and the command line."""

from __future__ import annotations

import argparse
import hashlib
import re
from pathlib import Path

import pytest
from support.gateway import ADMIN, HTTP, FakeBackend, admin_tenants, auth, chat_body, metric, serve

from fairserve.gateway import build_config, load_config
from fairserve.gateway import cli as gateway_cli
from fairserve.tenancy import key_digest

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[1] / "docs" / "gateway.md"


def test_admin_api():
    with serve(FakeBackend()) as base:
        for headers, status in [({}, 401), ({"Authorization": "Bearer wrong"}, 401), (auth("alice"), 403)]:
            r = HTTP.get(base + "/admin/tenants", headers=headers)
            assert r.status_code == status and "error" in r.json()
        assert HTTP.post(base + "/admin/reset", headers=auth("bob")).status_code == 403
        assert HTTP.post(base + "/v1/chat/completions", json=chat_body(3), headers=auth("alice")).status_code == 200
        alice = admin_tenants(base)["alice"]
        assert alice["counter"] == alice["service"] > 0 and alice["queue_length"] == alice["in_flight"] == 0
        assert alice["weight"] == 1.0

        admin = {"Authorization": f"Bearer {ADMIN}"}
        url = base + "/admin/tenants/alice/weight"
        for body in (
            b"{}",
            b'{"weight": 0}',
            b'{"weight": -1}',
            b'{"weight": "2"}',
            b"[]",
            b"nope",
            b'{"weight": true}',
        ):
            assert HTTP.put(url, content=body, headers=admin).status_code == 400, body
        assert HTTP.put(base + "/admin/tenants/nobody/weight", json={"weight": 2}, headers=admin).status_code == 404
        r = HTTP.put(url, json={"weight": 4}, headers=admin)
        assert r.status_code == 200 and r.json()["weight"] == 4.0
        assert admin_tenants(base)["alice"]["weight"] == 4.0
        assert metric(base, "fairserve_gateway_tenant_weight", tenant="alice") == 4.0

        r = HTTP.post(base + "/admin/reset", headers=admin)
        assert r.status_code == 200 and r.json()["reset"] is True
        alice = admin_tenants(base)["alice"]
        assert alice["counter"] == 0 and alice["service"] > 0  # service is history; counters restart


def test_admin_api_is_off_without_an_admin_key():
    with serve(FakeBackend(), admin_key=None) as base:
        assert HTTP.get(base + "/admin/tenants", headers=auth("alice")).status_code == 403
        assert HTTP.get(base + "/admin/tenants", headers={"Authorization": "Bearer x"}).status_code == 401


def base_config(**kw) -> dict:
    return {
        "backends": [{"url": "http://127.0.0.1:8000/v1"}],
        "tenants": [{"name": "a", "api_keys": ["ka"]}, {"name": "b", "api_keys": ["kb"], "weight": 2}],
        **kw,
    }


def test_config_defaults():
    cfg = build_config(base_config())
    assert cfg.backends[0].url == "http://127.0.0.1:8000"  # a trailing /v1 is accepted
    assert cfg.listen == "127.0.0.1:8080" and cfg.policy == "vtc" and cfg.weights() == {"a": 1.0, "b": 2.0}
    assert cfg.key_owners().clear == {"ka": "a", "kb": "b"} and not cfg.trusted_proxy


@pytest.mark.parametrize(
    "change,key",
    [
        ({"backends": []}, "backends"),
        ({"backends": [{"url": "ftp://x"}]}, "backends.0.url"),
        ({"backends": [{"url": "http://x", "max_inflight_requests": 0}]}, "backends.0.max_inflight_requests"),
        ({"tenants": [{"name": "a", "api_keys": ["k"], "weight": 0}]}, "tenants.0.weight"),
        ({"tenants": [{"name": "a"}]}, "tenants.0"),  # no key (`api_keys = []`: keys made through the API)
        ({"tenants": [{"name": "a", "api_key_sha256": ["abc"]}]}, "tenants.0.api_key_sha256"),
        ({"tenants": [{"name": "a", "api_keys": ["k"], "quota": {"per": "week", "tokens": 5}}]}, "tenants.0.quota.per"),
        ({"tenants": [{"name": "a", "api_keys": ["k"], "quota": {"per": "day"}}]}, "tenants.0.quota"),
        ({"tenants": [{"name": "a b", "api_keys": ["k"]}]}, "tenants.0.name"),
        ({"policy": "best"}, "policy"),
        ({"policy": "rpm:x"}, "policy"),
        ({"listen": "8080"}, "listen"),
        ({"queue_ttl_s": 0}, "queue_ttl_s"),
        ({"tokenizer": "tiktoken:cl100k_base"}, "tokenizer"),
        ({"colour": "blue"}, "colour"),
        ({"trusted_proxy": "perhaps"}, "trusted_proxy"),
    ],
)
def test_config_errors_name_the_key(change, key):
    with pytest.raises(ValueError) as e:
        build_config(base_config(**change))
    message = str(e.value)
    assert f"'{key}'" in message and "\n" not in message, message


@pytest.mark.parametrize(
    "change,words",
    [
        ({"tenants": [{"name": "a", "api_keys": ["k"]}, {"name": "a", "api_keys": ["j"]}]}, "tenant names"),
        ({"tenants": [{"name": "a", "api_keys": ["k"]}, {"name": "b", "api_keys": ["k"]}]}, "shared"),
        ({"admin_key": "ka"}, "admin_key"),
        ({"tenants": [{"name": "a", "api_keys": ["k"]}, {"name": "b", "api_key_sha256": [key_digest("k")]}]}, "shared"),
    ],
)
def test_config_cross_checks(change, words):
    with pytest.raises(ValueError, match=words):
        build_config(base_config(**change))


def test_forwarded_allow_ips_are_addresses_and_networks_or_any():
    given = {"10.0.0.0/8, ::1": ["10.0.0.0/8", "::1"], "*": ["*"], ("192.0.2.7",): ["192.0.2.7"], (): []}
    for value, kept in given.items():
        assert build_config(base_config(forwarded_allow_ips=value)).forwarded_allow_ips == kept
    # NOTE: uvicorn takes an entry it cannot parse (a name, host bits set) for a literal that never matches
    for value in (["10.0.0.1/8"], "10.0.0.1, proxy.local", ["*", "10.0.0.1"], "10.0.0.1,"):
        with pytest.raises(ValueError, match="'forwarded_allow_ips': each entry must be an IP address") as e:
            build_config(base_config(forwarded_allow_ips=value))
        assert "\n" not in str(e.value)


def test_a_hashed_key_authenticates_and_a_wrong_key_does_not():
    digest = hashlib.sha256(b"secret-key").hexdigest()
    cfg = build_config(base_config(tenants=[{"name": "a", "api_key_sha256": [digest.upper()]}]))
    owners = cfg.key_owners()
    assert owners.get("secret-key") == "a" and "secret-key" in owners
    assert owners.get("secret-kez") is None and owners.get(digest) is None  # the digest itself is no key
    assert "secret-key" not in cfg.model_dump_json()  # the config holds no key


def test_documented_example_config_loads(tmp_path):
    example = re.search(r"```toml\n(.*?)```", DOC.read_text(), re.S).group(1)
    (tmp_path / "gw.toml").write_text(example)
    cfg = load_config(tmp_path / "gw.toml")
    assert len(cfg.tenants) >= 2 and cfg.backends
    (tmp_path / "bad.toml").write_text("listen = ")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(tmp_path / "bad.toml")
    with pytest.raises(ValueError, match="not found"):
        load_config(tmp_path / "missing.toml")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    gateway_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["gateway", *argv])


def test_flags_override_the_file(tmp_path):
    (tmp_path / "gw.toml").write_text(
        'policy = "vtc"\nqueue_limit = 5\n[[backends]]\nurl = "http://a:1"\n[[tenants]]\nname = "t"\napi_keys = ["k"]\n'
    )
    cfg = gateway_cli.config_from_args(
        parse(
            "--config",
            str(tmp_path / "gw.toml"),
            "--policy",
            "fcfs",
            "--backend",
            "http://b:2,max_requests=3,max_tokens=900,api_key=s",
            "--tenant",
            "x:k1",
            "--tenant",
            "x:k2:2.5",
            "--tenant",
            "y:k3",
            "--w-q",
            "3",
            "--queue-ttl",
            "9",
            "--trusted-proxy",
            "--admin-key",
            "adm",
        )
    )
    assert cfg.policy == "fcfs" and cfg.queue_limit == 5 and cfg.w_q == 3 and cfg.queue_ttl_s == 9
    assert [(b.url, b.max_inflight_requests, b.max_inflight_tokens, b.api_key) for b in cfg.backends] == [
        ("http://b:2", 3, 900, "s")
    ]
    assert [(t.name, t.api_keys, t.weight) for t in cfg.tenants] == [("x", ["k1", "k2"], 2.5), ("y", ["k3"], 1.0)]
    assert cfg.trusted_proxy and cfg.admin_key == "adm"
    flags_only = gateway_cli.config_from_args(
        parse("--backend", "http://b:2", "--tenant", "t:k", "--listen", "0.0.0.0:9000")
    )
    assert flags_only.host == "0.0.0.0" and flags_only.port == 9000


@pytest.mark.parametrize(
    "argv,words",
    [
        ((), "backends"),
        (("--backend", "http://b:2,max_requests=x", "--tenant", "t:k"), "max_requests"),
        (("--backend", "http://b:2,speed=9", "--tenant", "t:k"), "speed"),
        (("--backend", "http://b:2", "--tenant", "t"), "PATH:KEY"),
        (("--backend", "http://b:2", "--tenant", "t:k:heavy"), "heavy"),
        (("--backend", "http://b:2", "--tenant", "t:k", "--policy", "nope"), "policy"),
    ],
)
def test_run_raises_one_line_value_errors(argv, words):
    with pytest.raises(ValueError, match=words) as e:
        gateway_cli.run(parse(*argv))
    assert "\n" not in str(e.value)


def test_run_serves_with_uvicorn(monkeypatch, capsys):
    import uvicorn

    from fairserve.api.server import free_port

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    port = free_port()
    listen = ("--listen", f"127.0.0.1:{port}")
    assert gateway_cli.run(parse("--backend", "http://b:2", "--tenant", "t:k", *listen)) == 0
    assert seen["host"] == "127.0.0.1" and seen["port"] == port and seen["app"].title == "fairserve gateway"
    assert seen["access_log"] is False  # off by default (issue 51): the usage log is the record of requests
    assert "1 tenant, 1 backend, policy vtc" in capsys.readouterr().err
    assert gateway_cli.run(parse("--backend", "http://b:2", "--tenant", "t:k", "--access-log", *listen)) == 0
    assert seen["access_log"] is True
    assert gateway_cli.run(parse("--backend", "http://b:2", "--tenant", "t:k", "--no-access-log", *listen)) == 0
    assert seen["access_log"] is False  # the flag of before, still taken


def test_forwarded_allow_ips_go_to_uvicorn_from_the_flag_or_the_file(monkeypatch, tmp_path):
    import uvicorn

    from fairserve.api.server import free_port

    seen: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    flags = ("--backend", "http://b:2", "--tenant", "t:k", "--listen", f"127.0.0.1:{free_port()}")
    assert gateway_cli.run(parse(*flags, "--forwarded-allow-ips", "10.0.0.0/8, fd00::1")) == 0
    assert seen["forwarded_allow_ips"] == ["10.0.0.0/8", "fd00::1"]
    seen.clear()
    assert gateway_cli.run(parse(*flags)) == 0
    assert "forwarded_allow_ips" not in seen  # unset: uvicorn's own default ($FORWARDED_ALLOW_IPS, else loopback)
    (tmp_path / "gw.toml").write_text('forwarded_allow_ips = "*"\n')
    assert gateway_cli.run(parse("--config", str(tmp_path / "gw.toml"), *flags)) == 0
    assert seen["forwarded_allow_ips"] == ["*"]


def test_access_log_from_the_file_and_the_flag(tmp_path):
    (tmp_path / "gw.toml").write_text(
        'access_log = true\n[[backends]]\nurl = "http://a:1"\n[[tenants]]\nname = "t"\napi_keys = ["k"]\n'
    )
    assert gateway_cli.config_from_args(parse("--config", str(tmp_path / "gw.toml"))).access_log
    assert not gateway_cli.config_from_args(parse("--config", str(tmp_path / "gw.toml"), "--no-access-log")).access_log
    assert not gateway_cli.config_from_args(parse("--backend", "http://b:2", "--tenant", "t:k")).access_log
    assert gateway_cli.config_from_args(parse("--backend", "http://b:2", "--tenant", "t:k", "--access-log")).access_log


def test_serve_refuses_quotas_with_one_line():
    from fairserve.serve.config import load_config as load_serve

    tenant = {"name": "a", "api_keys": ["k"], "quota": {"per": "day", "tokens": 5}}
    with pytest.raises(ValueError, match="does not enforce quotas") as e:
        load_serve(None, {"model": "tiny-random", "tenants": [tenant]})
    assert "\n" not in str(e.value)
