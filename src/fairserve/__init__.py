"""fairserve: fair sharing of an LLM server among many clients (the Virtual Token Counter and its drivers)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fairserve")
except PackageNotFoundError:  # NOTE: run from a source tree that was never installed
    __version__ = "0+unknown"
