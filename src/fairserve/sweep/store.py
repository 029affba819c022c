"""Finished runs on disk, one JSON file each (`OUT/runs/KEY.json`), written atomically so an interrupted sweep loses
no finished run and never leaves half a file. A run's key is a digest of its spec, its workload file's hash and
fairserve's code version; the version carries a digest of the package's own source files, so a code change without a
version bump still gives every run a new key, and results of another version are removed as stale."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent.parent  # src/fairserve
SOURCE_SUFFIXES = (".py", ".csv")  # the code, and the workloads it ships (workloads/data)


def source_digest(root: Path = PACKAGE) -> str:
    """SHA-256 (16 hex digits) over the relative paths and contents of the package's source files."""
    h = hashlib.sha256()
    files = sorted(
        p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts and p.is_file()
    )
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


@cache
def code_version() -> str:
    """'0.1.0+src.<digest>': the release (of the checkout the package runs from, else of the installed package) and
    the digest of the code that runs."""
    return f"{_release()}+src.{source_digest()}"


def _release() -> str:
    pyproject = PACKAGE.parent.parent / "pyproject.toml"  # a source checkout (src/ layout)
    try:
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == "fairserve":
            return str(project["version"])
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        pass
    try:
        return metadata.version("fairserve")
    except metadata.PackageNotFoundError:
        return "unreleased"


@cache
def commit() -> str | None:
    """The git commit of the checkout the package runs from ('-dirty' when its sources differ), or None."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(PACKAGE), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run_key(spec: dict[str, Any], workload_sha256: str | None, version: str) -> str:
    doc = json.dumps({"spec": spec, "workload_sha256": workload_sha256, "version": version}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:24]


class Store:
    """The finished runs of one output folder, for one code version."""

    def __init__(self, out_dir: str | Path, version: str):
        self.dir = Path(out_dir) / "runs"
        self.version = version

    def load(self) -> dict[str, dict[str, Any]]:
        """key -> record for every readable run file of this version."""
        out: dict[str, dict[str, Any]] = {}
        if not self.dir.is_dir():
            return out
        for path in self.dir.glob("*.json"):
            record = _read(path)
            if record is not None and record.get("version") == self.version and record.get("key") == path.stem:
                out[path.stem] = record
        return out

    def prune(self) -> int:
        """Remove the run files of other code versions (and unreadable ones); how many were removed."""
        removed = 0
        if not self.dir.is_dir():
            return 0
        for path in self.dir.glob("*.json"):
            record = _read(path)
            if record is None or record.get("version") != self.version:
                path.unlink(missing_ok=True)
                removed += 1
        for tmp in self.dir.glob(".*.tmp"):  # left by a run killed mid-write
            tmp.unlink(missing_ok=True)
        return removed

    def save(self, record: dict[str, Any]) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{record['key']}.json"
        write_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
        return path


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename: readers see the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
