"""fairserve: fair sharing of an LLM server among many clients (the Virtual Token Counter and its drivers)."""

from typing import Any


def __getattr__(name: str) -> Any:
    # NOTE: read on first use: importlib.metadata costs ~0.1 s at start-up, and most commands never ask
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("fairserve")
        except PackageNotFoundError:  # NOTE: run from a source tree that was never installed
            value = "0+unknown"
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
