"""Starting `fairserve` servers in their own processes for tests (loopback ports, stopped by the test)."""

import contextlib
import os
import subprocess
import sys
import tempfile
import time

import httpx

from fairserve.api.server import free_port


@contextlib.contextmanager
def fairserve_process(*args, timeout_s: float = 30.0, env: dict[str, str] | None = None):
    """`fairserve ARGS --…` in its own process on a loopback port, once its /healthz answers; yields (url, process).
    The process is terminated on exit unless the test already stopped it. `env`: variables set for it (a benchmark
    runs another checkout's code with `PYTHONPATH`)."""
    port = free_port()
    cmd = [sys.executable, "-m", "fairserve", *args]
    cmd += ["--listen", f"127.0.0.1:{port}"]
    log = tempfile.TemporaryFile()  # NOTE: not a pipe: a busy server would block once a pipe's buffer is full
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                log.seek(0)
                raise AssertionError(f"{args[0]} did not start: {log.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
        log.close()


@contextlib.contextmanager
def serve(*args, env: dict[str, str] | None = None):
    """Just the URL of `fairserve_process(*args)`."""
    with fairserve_process(*args, env=env) as (url, _):
        yield url
