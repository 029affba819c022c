"""Config plumbing every server shares: a strict pydantic base, TOML reading, one-line validation errors.

Every validation problem becomes one `ValueError` line that names the offending key, e.g.
`config key 'backends.0.max_inflight_requests': Input should be greater than or equal to 1` (the first
`MAX_PROBLEMS`, then how many more). Every way the file can fail to be read is one `ValueError` line that names the
file and why: missing, unreadable (permissions, a symlink loop, any `OSError`), not a regular file (a directory, a
named pipe, a device: refused before it is opened), larger than `MAX_CONFIG_BYTES`, no answer within
`READ_TIMEOUT_S`, not UTF-8, not TOML.
"""

from __future__ import annotations

import os
import stat
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, SupportsIndex, TypeVar, cast

from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)

MAX_CONFIG_BYTES = 16 * 2**20  # NOTE: a file of 10,000 tenants is ~0.6 MB
READ_TIMEOUT_S = 5.0  # NOTE: the read only (a hung filesystem); validating a large file takes longer
MAX_PROBLEMS = 5  # validation problems listed in the line; the rest are counted
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}
_stuck: dict[Path, threading.Thread] = {}  # reads that outlived READ_TIMEOUT_S, by file: at most one each
PIECE = 2**18  # characters of a file's text turned from CRLF to LF in one call (`Text`)


class Strict(BaseModel):
    """Unknown keys are errors (a typo in a config file must not be ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=False)


def split_listen(v: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 in brackets: `[::1]:8080`) → (host, port). Raises ValueError with what is expected."""
    host, sep, port = v.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be HOST:PORT, e.g. 127.0.0.1:8080, got {v!r}")
    return host.strip("[]"), int(port)


def check_listen(v: str) -> str:
    split_listen(v)
    return v


def one_line(err: ValidationError) -> str:
    """The first `MAX_PROBLEMS` problems, then `and N more`."""
    errors = err.errors()
    parts = []
    for e in errors[:MAX_PROBLEMS]:
        key = ".".join(str(x) for x in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        parts.append(f"config key '{key}': {msg}" if key else f"config: {msg}")
    if len(errors) > MAX_PROBLEMS:
        parts.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return "; ".join(parts).replace("\n", " ")


class Text:
    """A file's text as `tomllib.loads` takes it: all it asks of its argument is `replace("\r\n", "\n")`, the line
    ends turned into LF over the whole text in one call, which this makes a piece at a time with the same result (the
    text itself where it has no CR). NOTE: that one call over a file of 100,000 tenants (7.5 MiB) holds the interpreter
    6-7 ms, in which no other thread runs: a live reload reads on one, beside the event loop
    (gateway/settings/reload.py). Not a subclass of `str`: making one copies the text (9 ms at 7.5 MiB)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def replace(self, old: str, new: str, count: SupportsIndex = -1, /) -> str:
        text = self.text
        if old != "\r\n" or new != "\n" or count != -1:
            return text.replace(old, new, count)
        if "\r" not in text:
            return text
        pieces, start, end = [], 0, len(text)
        while start < end:
            cut = min(start + PIECE, end)
            while cut < end and text[cut - 1] == "\r":  # NOTE: no CRLF across two pieces
                cut += 1
            pieces.append(text[start:cut].replace("\r\n", "\n"))
            start = cut
        return "".join(pieces)


def build_config(data: dict[str, Any], model: type[M]) -> M:
    """Validate a dict (parsed TOML, possibly with flag overrides). Raises ValueError with one line."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ValueError(one_line(e)) from None


def read_toml(path: str | Path, timeout_s: float = READ_TIMEOUT_S) -> dict[str, Any]:
    """The file's table. Raises ValueError with one line naming the file and why it cannot be used."""
    p = Path(path)
    try:
        data = _bounded(p, lambda: _read(p), timeout_s)
    except FileNotFoundError:
        raise ValueError(f"config file not found: {p}") from None
    except OSError as e:
        raise ValueError(f"config file {p} cannot be read: {e.strerror or e}") from None
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"config file {p} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    try:
        return tomllib.loads(cast(str, Text(text)))  # NOTE: its one call over the whole text made in pieces
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {p} is not valid TOML: {e}") from None
    except RecursionError:
        raise ValueError(f"config file {p} is not valid TOML: its arrays or tables are nested too deeply") from None


def _bounded(p: Path, read: Callable[[], bytes], timeout_s: float) -> bytes:
    """`read()` on a thread of its own, waited for `timeout_s`. NOTE: a thread blocked in a system call cannot be
    stopped: one left blocked is a daemon (it holds no exit up), and the file's next read is refused until it ends
    rather than blocking another thread."""
    if (left := _stuck.get(p)) is not None and left.is_alive():
        raise ValueError(f"config file {p} cannot be read: an earlier read has not returned (a hung filesystem?)")
    out: list[bytes] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(read())
        except BaseException as e:  # NOTE: raised again on the caller's thread
            failed.append(e)

    reader = threading.Thread(target=run, name=f"read {p}", daemon=True)
    reader.start()
    reader.join(timeout_s)
    if reader.is_alive():
        _stuck[p] = reader
        raise ValueError(f"config file {p} cannot be read: no answer within {timeout_s:g} s (a hung filesystem?)")
    _stuck.pop(p, None)
    if failed:
        raise failed[0]
    return out[0]


def _read(p: Path) -> bytes:
    """The file's bytes: a regular file of at most `MAX_CONFIG_BYTES`, checked before it is opened and again on
    what was opened (it may have been replaced in between)."""
    _check(p, os.stat(p))
    # NOTE: O_NONBLOCK: opening a named pipe put in its place returns at once rather than waiting for a writer
    with open(os.open(p, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        _check(p, os.fstat(f.fileno()))
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise _too_large(p)
    return data


def _check(p: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "a special file")
        raise ValueError(f"config file {p} cannot be read: it is {kind}, not a regular file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise _too_large(p)


def _too_large(p: Path) -> ValueError:
    return ValueError(f"config file {p} cannot be read: it is larger than {MAX_CONFIG_BYTES // 2**20} MiB, the limit")


def load_config(model: type[M], path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> M:
    """The file's keys, then `overrides` (e.g. from flags) on top; lists given as overrides replace the file's. A
    validation line ends naming the file: `(in config file gateway.toml)`, `(in config file gateway.toml or a flag)`."""
    data = read_toml(path) if path is not None else {}
    tables = [v for v in data.values() if isinstance(v, list)]  # the file's own arrays of tables
    data.update(overrides or {})
    try:
        return build_config(data, model)
    except ValueError as e:
        if path is None:
            raise
        raise ValueError(f"{e} (in config file {path}{' or a flag' if overrides else ''})") from None
    finally:
        # NOTE: freed a table at a time: at once, 100,000 tenants' tables take 9 ms in one go, in which no other thread
        # (a reload reads on one: the event loop) runs
        for array in tables:
            while array:
                array.pop()
