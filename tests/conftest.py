"""Settings for the whole suite (the main tier, and the Python 3.12 and vLLM tiers that run some of its files): the
tiers (CONTRIBUTING.md), Hypothesis's profiles, one thread per process."""

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

# NOTE: one intra-op thread per process. The suite runs on pytest-xdist workers and starts servers beside them;
# torch's default (a thread per core in every process) oversubscribes the cores: the transformers tests ran ~4x slower
os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    from hypothesis import settings
except ImportError:  # NOTE: the Python 3.12 tier's venv has the package and pytest only, and runs no properties
    settings = None

# NOTE: under CI the properties draw the same examples on every run, so a submission passes or fails on its code, not
# on the draw; runs elsewhere draw new examples each time (how rare counterexamples are found). No deadline in either:
# a deadline measures the machine (a loaded one fails an example that is correct)
if settings is not None:
    settings.register_profile("ci", derandomize=True, deadline=None)
    settings.register_profile("local", deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") == "true" else "local")

# ---- the tiers (CONTRIBUTING.md): every module under tests/ declares one; a unit test reaches no network, process or
# clock
TIERS = ("unit", "integration")
HERE = Path(__file__).resolve().parent


def pytest_ignore_collect(collection_path, config):
    """With `-m unit` (./dev.sh fast), a module that declares the integration tier is not even imported: importing
    the servers' tests (and what they import: torch, transformers) is half a minute."""
    if config.option.markexpr != "unit" or collection_path.suffix != ".py" or HERE not in collection_path.parents:
        return None
    return True if "pytestmark = pytest.mark.integration" in collection_path.read_text() else None


def pytest_collection_modifyitems(config, items):
    undeclared = set()
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if HERE not in path.parents:  # NOTE: tests_vllm/ and tests_ray/ are tiers of their own
            continue
        marks = getattr(item.module, "pytestmark", [])
        declared = [m.name for m in (marks if isinstance(marks, list) else [marks]) if m.name in TIERS]
        if len(declared) != 1:
            undeclared.add(path.relative_to(HERE).as_posix())
    if undeclared:
        raise pytest.UsageError(
            "every test module declares its tier: pytestmark = pytest.mark.unit or pytest.mark.integration "
            f"(CONTRIBUTING.md); none or both in: {', '.join(sorted(undeclared))}"
        )


def _refused(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a unit test {what}: it belongs in the integration tier (CONTRIBUTING.md)")

    return refuse


@pytest.fixture(autouse=True)
def _unit_tier_reaches_no_network_process_or_clock(request, monkeypatch):
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    sleep, asleep = time.sleep, asyncio.sleep
    monkeypatch.setattr(socket.socket, "bind", _refused("binds a socket"))
    monkeypatch.setattr(socket.socket, "connect", _refused("connects a socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _refused("starts a subprocess"))
    monkeypatch.setattr(time, "sleep", lambda s: _refused("sleeps")() if s > 0 else sleep(0))
    monkeypatch.setattr(asyncio, "sleep", lambda s, *a: _refused("sleeps")() if s > 0 else asleep(0, *a))
    yield
