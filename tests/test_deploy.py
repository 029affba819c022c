"""The deployment files, as far as this machine allows (docs/deploy.md says what is and is not run):

- the Dockerfile's install steps in a fresh venv and its command line (tests/support/image.py), serving the
  Kubernetes ConfigMap's config against the emulator and a real redis-server, probed as the manifests probe it;
- the Kubernetes manifests validated offline with `kubernetes-validate`, strictly (it ships the API schemas);
- the systemd unit checked with `systemd-analyze verify`.
Under CI=true a missing `systemd-analyze` fails; elsewhere it is skipped."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from support.image import REPO, Dockerfile, build
from support.processes import fairserve_process
from support.redis_server import redis_server

from fairserve.api.server import free_port

pytestmark = pytest.mark.integration

K8S = REPO / "deploy" / "kubernetes"
UNIT = REPO / "deploy" / "systemd" / "fairserve-gateway.service"
MOUNT = "/etc/fairserve"


def manifests() -> dict[tuple[str, str], dict]:
    docs = [d for path in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def gateway_container() -> dict:
    (container,) = manifests()["Deployment", "fairserve-gateway"]["spec"]["template"]["spec"]["containers"]
    return container


def wait_for(probe, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.1)
    return False


def test_the_manifests_are_valid_kubernetes():
    import kubernetes_validate

    found = manifests()
    assert {kind for kind, _ in found} == {"ConfigMap", "Deployment", "Service"} and len(found) == 7
    version = kubernetes_validate.latest_version()
    for (kind, name), doc in found.items():
        try:
            kubernetes_validate.validate(doc, version, strict=True)  # strict: an unknown field is an error too
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{kind} {name}: {e.message} at {'.'.join(map(str, e.path))}") from None


def test_the_manifests_agree_with_each_other_and_the_image():
    found = manifests()
    cfg = tomllib.loads(found["ConfigMap", "fairserve-gateway"]["data"]["gateway.toml"])
    named = {urlsplit(cfg["state"]).netloc, *(urlsplit(b["url"]).netloc for b in cfg["backends"])}
    assert named == {"redis:6379", "vllm:8000"}  # the config names the Services the other files define
    for service, port in [("vllm", 8000), ("redis", 6379)]:
        (spec_port,) = found["Service", service]["spec"]["ports"]
        assert spec_port["port"] == port
    grace = found["Deployment", "fairserve-gateway"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > cfg["drain_timeout_s"]  # SIGTERM's drain ends before the kill
    container = gateway_container()
    assert "command" not in container and "args" not in container  # the image's ENTRYPOINT and CMD run
    image_cmd = Dockerfile.read().command()
    assert f"{MOUNT}/gateway.toml" in image_cmd and "0.0.0.0:8080" in image_cmd
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == MOUNT
    assert container["ports"] == [{"name": "http", "containerPort": 8080}]
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    (svc_port,) = found["Service", "fairserve-gateway"]["spec"]["ports"]
    assert svc_port["targetPort"] == "http"


def test_the_image_serves_the_configmaps_config_against_a_backend_and_redis(tmp_path):
    """Built as tests/support/image.py says; then its command line, with the ConfigMap mounted, as the Deployment
    runs it: requests through it with the official client, /livez alive and /healthz ready, then the backend gone:
    not ready, still alive (no restart for an outage)."""
    from openai import OpenAI

    dockerfile = Dockerfile.read()
    image = build(dockerfile, tmp_path)
    assert image.skipped == ["useradd --system --uid 10001 --no-create-home fairserve"]
    assert not (image.workdir / "src").exists()  # the sources are installed, not run from the copy
    with redis_server() as redis, fairserve_process("emulate") as (backend, emulator):
        toml = manifests()["ConfigMap", "fairserve-gateway"]["data"]["gateway.toml"]
        # NOTE: the Services' names stand for loopback addresses here, the only substitution in the config
        toml = toml.replace("http://vllm:8000", backend).replace("redis://redis:6379/0", redis.url)
        mount = tmp_path / "etc-fairserve"
        mount.mkdir()
        (mount / "gateway.toml").write_text(toml)
        port = free_port()
        argv = [
            str(mount / "gateway.toml")
            if a == f"{MOUNT}/gateway.toml"
            else f"127.0.0.1:{port}"
            if a == "0.0.0.0:8080"
            else a
            for a in dockerfile.command()
        ]
        with tempfile.TemporaryFile() as log:
            gateway = subprocess.Popen(
                image.resolve(argv), cwd=image.workdir, env=image.env, stdout=log, stderr=subprocess.STDOUT
            )
            base = f"http://127.0.0.1:{port}"
            try:
                container = gateway_container()
                live, ready = (base + container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe"))
                up = wait_for(lambda: _status(ready) == 200, 30)
                log.seek(0)
                assert up, log.read().decode(errors="replace")[-2000:]
                client = OpenAI(base_url=base + "/v1", api_key="sk-search-change-me", max_retries=0)
                answer = client.completions.create(model=client.models.list().data[0].id, prompt="hi", max_tokens=5)
                assert answer.usage.completion_tokens == 5
                health = dockerfile.healthcheck()
                check = [a.replace("127.0.0.1:8080", f"127.0.0.1:{port}") for a in health]
                assert subprocess.run(image.resolve(check), env=image.env, timeout=10).returncode == 0

                emulator.kill()
                emulator.wait()
                assert wait_for(lambda: _status(ready) == 503, 20)
                assert _status(live) == 200
            finally:
                gateway.terminate()
                code = gateway.wait(20)
            log.seek(0)
            # NOTE: uvicorn drains, then ends by the signal it caught (as systemd and Kubernetes expect of SIGTERM)
            assert code == -signal.SIGTERM and b"Finished server process" in log.read()


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def test_the_systemd_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("systemd-analyze is missing: CI=true checks the systemd unit with it (apt-get install systemd)")
        pytest.skip("systemd-analyze is not installed")
    text = UNIT.read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text  # NOTE: SIGHUP reloads (tests/test_gateway_reload.py)
    # NOTE: verify needs ExecStart's program to exist: the suite's fairserve stands for /opt/fairserve's
    here = Path(sys.executable).parent / "fairserve"
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace("/opt/fairserve/bin/fairserve", str(here)))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr
    start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert start.split()[1:] == ["gateway", "--config", f"{MOUNT}/gateway.toml"]
    assert "RestartPreventExitStatus=2" in text  # bad input: the README's exit status 2, not worth a restart
