"""Live configuration, a file that cannot be used: `POST /admin/reload` with the config path turned into a directory,
a symlink loop, a named pipe with no writer, a file over the size limit or 10,000 tenants with a wrong key answers 400
`invalid_config` in one short line naming the file, `/healthz` answers meanwhile, and the running configuration is
kept. (SIGHUP with a directory: test_gateway_reload.py.)"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from support.gateway import ADMIN, HTTP, FakeBackend, admin_tenants, auth, chat_body

from fairserve.api.config import MAX_CONFIG_BYTES
from fairserve.api.server import running_server
from fairserve.gateway import create_app, load_config

pytestmark = pytest.mark.integration

TENANTS = 10_000


def good(url: str) -> str:
    return f'admin_key = "{ADMIN}"\nhealth_interval_s = 0\n[[backends]]\nurl = "{url}"\n' + tenant("alice", "key-alice")


def tenant(name: str, key: str, extra: str = "") -> str:
    return f'[[tenants]]\nname = "{name}"\napi_keys = ["{key}"]\n{extra}'


def wrong_keys(url: str) -> str:
    """alice, and 10,000 tenants each with `wieght` for `weight`."""
    return good(url) + "".join(tenant(f"t{i}", f"key-{i}", "wieght = 2\n") for i in range(TENANTS))


def huge(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)


CASES = {
    "directory": (lambda p, url: p.mkdir(), "cannot be read: it is a directory, not a regular file"),
    "symlink loop": (
        lambda p, url: (p.symlink_to(p.with_name("b")), p.with_name("b").symlink_to(p)),
        "cannot be read: Too many levels of symbolic links",
    ),
    "named pipe": (lambda p, url: os.mkfifo(p), "cannot be read: it is a named pipe, not a regular file"),
    "huge file": (lambda p, url: huge(p), "cannot be read: it is larger than 16 MiB"),
    "10,000 wrong keys": (lambda p, url: p.write_text(wrong_keys(url)), f"and {TENANTS - 5} more"),
}


def remove(path: Path) -> None:
    for p in (path, path.with_name("b")):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.is_symlink() or p.exists():
            p.unlink()


def reload(base: str) -> httpx.Response:
    return HTTP.post(base + "/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)


def refused(answer: httpx.Response) -> str:
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_config", answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("reload refused, the running configuration is kept: ") and "\n" not in message
    return message


@pytest.mark.parametrize("case", CASES)
def test_a_file_that_cannot_be_read_or_validated_is_a_400_and_the_gateway_keeps_answering(tmp_path, case):
    make, words = CASES[case]
    fake = FakeBackend()
    path = tmp_path / "gateway.toml"
    with running_server(fake.app) as url:
        path.write_text(good(url))
        app = create_app(load_config(path), lambda: load_config(path))
        with running_server(app) as gw, ThreadPoolExecutor(1) as pool:
            remove(path)
            make(path, url)
            answer = pool.submit(reload, gw)
            # NOTE: the loop answers while the reload runs (a read on it would block every request)
            assert HTTP.get(gw + "/healthz", timeout=5).status_code == 200
            message = refused(answer.result())
            assert str(path) in message and words in message and len(message) < 500, message
            # the running configuration was kept: alice only, served
            assert list(admin_tenants(gw)) == ["alice"]
            ok = HTTP.post(gw + "/v1/chat/completions", json=chat_body(3), headers=auth("key-alice"))
            assert ok.status_code == 200
            remove(path)
            path.write_text(good(url) + tenant("bob", "key-bob"))
            assert reload(gw).status_code == 200 and list(admin_tenants(gw)) == ["alice", "bob"]
