"""Every recipe in the README runs as written (pasted into one shell) and stops cleanly: the blocks are read from
the README itself (tests/support/readme.py), so the README and this test cannot drift apart."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.readme import README, Block, blocks

pytestmark = pytest.mark.integration

ROOT = README.parent
ALL = blocks()
RUN = [b for b in ALL if b.run]
NEEDS = {"redis-server": "scripts/setup-redis.sh"}  # what a block's first line may install; CI=true needs it


def test_every_block_is_annotated_and_a_change_would_show():
    missing = [b.line for b in ALL if b.run is None]
    assert not missing, f"README blocks without a `<!-- readme: run|skip -->` annotation at lines {missing}"
    assert all(b.why for b in ALL if b.run is False), "a skipped block says why"
    assert len(RUN) >= 5
    fake = blocks("<!-- readme: run; replace A => B -->\n```sh\necho A\n```\n```python\nx = 1\n```\n")
    assert fake[0].code == "echo B\n" and fake[1].run is None


@pytest.mark.parametrize("block", RUN, ids=lambda b: f"line-{b.line}")
def test_readme_block_runs(block: Block, tmp_path: Path):
    for tool, installer in NEEDS.items():
        if tool in block.code and installer in block.code and shutil.which(tool) is None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true needs {tool} for the README block at line {block.line} ({installer})")
            pytest.skip(f"{tool} is not installed (run {installer} as root)")
    for name in ("scripts", "examples"):  # the block runs where a user pasting it would: a checkout
        (tmp_path / name).symlink_to(ROOT / name)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("FAIRSERVE_ARENA_TRACE", None)
    if block.lang == "python":
        cmd = [sys.executable, "-c", block.code]
    else:
        cmd = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    took = time.monotonic() - start
    assert done.returncode == 0, (
        f"README line {block.line} failed ({took:.0f} s):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    print(f"README block at line {block.line}: {took:.1f} s")
    ports = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", block.code)}
    ports |= {6379} if "redis-server" in block.code else set()
    assert not [p for p in ports if _listening(p)], f"README line {block.line} left servers running on {ports}"


def _listening(port: int, wait_s: float = 5.0) -> bool:
    """Whether something still answers on 127.0.0.1:`port` after `wait_s` (servers get that long to exit)."""
    deadline = time.monotonic() + wait_s
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)
