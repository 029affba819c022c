"""The real-vLLM tier: fairserve's scheduler inside vLLM's CPU build (`vllm-cpu` 0.32), in the venv that
`scripts/vllm_cpu_env.sh` creates. Run by `./dev.sh test` (after the main suite) or `./dev.sh test-vllm`.

Under CI=true a missing or broken vLLM fails the tier; elsewhere it is skipped with the reason."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

# the engine core in this process (its scheduler is then reachable); a small, fixed KV cache on CPU
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _vllm_or_reason() -> str | None:
    try:
        import vllm  # noqa: F401
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any failure to import is the reason)
        return f"{type(e).__name__}: {e}"
    return None


_REASON = _vllm_or_reason()
IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _REASON is None:
        return
    if IN_CI:
        raise pytest.UsageError(f"the real-vLLM tier cannot import vLLM (CI must run it): {_REASON}")
    skip = pytest.mark.skip(
        reason=f"real-vLLM tier skipped: vLLM is not importable here ({_REASON}); run it with ./dev.sh test-vllm"
    )
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    import vllm_cpu_model

    return vllm_cpu_model.build(vllm_cpu_model.default_dir())


@pytest.fixture(scope="session")
def engines(model_dir):
    """Engines built on first use and shared by every test of the session (see `engine.Engines`)."""
    from engine import Engines

    pool = Engines(model_dir)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def adapters(tmp_path_factory) -> dict[str, Path]:
    """Two random LoRA adapters of the test model, written here (nothing is downloaded)."""
    import vllm_cpu_model

    root = tmp_path_factory.mktemp("lora")
    return {name: vllm_cpu_model.lora_adapter(root / name, seed) for name, seed in (("a", 1), ("b", 2))}
