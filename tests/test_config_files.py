"""Reading a config file (api/config.py `read_toml`): every way it can fail is one `ValueError` line naming the file
and why (missing, permissions, a symlink loop, a directory, a named pipe, a device, too large, no answer in time, not
UTF-8, not TOML, nested too deeply), never an `OSError` or a read that blocks; a file with many validation problems
lists the first few and counts the rest; `fairserve gateway --config` reports each in one line and exits 2."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairserve import cli
from fairserve.api import config
from fairserve.api.config import MAX_CONFIG_BYTES, MAX_PROBLEMS, read_toml
from fairserve.gateway import load_config

pytestmark = pytest.mark.unit

NOBODY = 65534


def refusal(path: Path, **kw: float) -> str:
    with pytest.raises(ValueError) as e:
        read_toml(path, **kw)
    message = str(e.value)
    assert str(path) in message and "\n" not in message, message
    return message


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda p: p.mkdir(), "it is a directory, not a regular file"),
        (os.mkfifo, "it is a named pipe, not a regular file"),
        (lambda p: (p.symlink_to(p.with_name("b")), p.with_name("b").symlink_to(p)), "Too many levels of symbolic"),
        (lambda p: p.symlink_to("/dev/zero"), "it is a character device, not a regular file"),
        (lambda p: p.write_bytes(b'name = "caf\xe9"\n'), "is not UTF-8 text: invalid continuation byte at byte 11"),
        (lambda p: p.write_text("[[tenants]\nname = "), "is not valid TOML"),
        (lambda p: p.write_text("a = " + "[" * 5000 + "]" * 5000), "nested too deeply"),
        (lambda p: p.touch() or os.truncate(p, MAX_CONFIG_BYTES + 1), "it is larger than 16 MiB, the limit"),
        (lambda p: None, "config file not found"),
    ],
    ids=["directory", "fifo", "symlink-loop", "device", "not-utf8", "not-toml", "too-deep", "too-large", "missing"],
)
def test_a_file_that_cannot_be_read_is_one_line_naming_it_and_why(tmp_path, make, words):
    path = tmp_path / "gateway.toml"
    make(path)
    assert words in refusal(path)


def test_a_file_larger_than_it_says_is_refused_as_it_is_read(monkeypatch):
    # NOTE: /proc files say 0 bytes: only the read itself finds how large they are
    monkeypatch.setattr(config, "MAX_CONFIG_BYTES", 64)
    assert os.stat("/proc/self/status").st_size == 0
    assert "larger than" in refusal(Path("/proc/self/status"))


def test_a_named_pipe_put_in_place_after_the_check_is_refused_without_waiting_for_a_writer(tmp_path, monkeypatch):
    regular, pipe = tmp_path / "gateway.toml", tmp_path / "pipe"
    regular.write_text("a = 1\n")
    os.mkfifo(pipe)
    real = os.stat
    monkeypatch.setattr(config.os, "stat", lambda p, *a, **kw: real(regular if Path(p) == pipe else p, *a, **kw))
    assert "it is a named pipe, not a regular file" in refusal(pipe)


@contextlib.contextmanager
def unprivileged() -> Iterator[None]:
    """As root, the effective user `nobody` for the block: root reads any file whatever its mode."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(NOBODY)  # NOTE: a root that cannot do this fails here, loudly, rather than skipping the case
    try:
        yield
    finally:
        os.seteuid(0)


def test_a_file_without_read_permission_is_one_line(tmp_path):
    path = tmp_path / "gateway.toml"
    path.write_text("a = 1\n")
    path.chmod(0)
    with unprivileged():
        assert os.geteuid() != 0
        message = refusal(path)
    assert "cannot be read: Permission denied" in message


def test_a_read_without_answer_is_refused_and_the_next_one_waits_for_it_to_end(tmp_path, monkeypatch):
    path = tmp_path / "gateway.toml"
    released = threading.Event()

    def hung() -> bytes:  # NOTE: a read blocked in the kernel (a hung network filesystem)
        released.wait()
        return b"a = 1\n"

    monkeypatch.setattr(config, "_read", lambda p: hung())
    assert "cannot be read: no answer within 0 s" in refusal(path, timeout_s=0)
    # the blocked read holds no second thread: the next read is refused until it ends
    assert "an earlier read has not returned" in refusal(path, timeout_s=0)
    released.set()
    config._stuck[path].join()
    assert read_toml(path, timeout_s=10) == {"a": 1}


def test_many_validation_problems_list_the_first_few_and_count_the_rest(tmp_path):
    tenants = "".join(f'[[tenants]]\nname = "t{i}"\napi_keys = ["key-{i}"]\nwieght = 2\n' for i in range(10_000))
    path = tmp_path / "gateway.toml"
    path.write_text('[[backends]]\nurl = "http://127.0.0.1:9"\n' + tenants)
    with pytest.raises(ValueError) as e:
        load_config(path)
    message = str(e.value)
    assert message.count("Extra inputs are not permitted") == MAX_PROBLEMS
    assert message.startswith("config key 'tenants.0.wieght': ")
    assert message.endswith(f"; and {10_000 - MAX_PROBLEMS} more (in config file {path})") and len(message) < 500


def test_many_repeated_tenant_names_list_the_first_few(tmp_path):
    tenants = "".join(f'[[tenants]]\nname = "t{i % 5000:04}"\napi_keys = ["key-{i}"]\n' for i in range(10_000))
    path = tmp_path / "gateway.toml"
    path.write_text('[[backends]]\nurl = "http://127.0.0.1:9"\n' + tenants)
    first = "t0000, t0001, t0002, t0003, t0004"
    with pytest.raises(ValueError, match=rf"repeated: {first} and 4995 more \(in config file "):
        load_config(path)


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_the_gateway_refuses_such_a_file_at_start_in_one_line_and_exits_2(tmp_path, capsys, kind):
    path = tmp_path / "gateway.toml"
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    assert cli.main(["gateway", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fairserve: error: config file {path} cannot be read: it is a ") and err.count("\n") == 1
