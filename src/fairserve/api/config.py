"""Config plumbing every server shares: a strict pydantic base, TOML reading, one-line validation errors.

Every validation problem becomes one `ValueError` line that names the offending key, e.g.
`config key 'backends.0.max_inflight_requests': Input should be greater than or equal to 1`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)


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
    parts = []
    for e in err.errors():
        key = ".".join(str(x) for x in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        parts.append(f"config key '{key}': {msg}" if key else f"config: {msg}")
    return "; ".join(parts).replace("\n", " ")


def build_config(data: dict[str, Any], model: type[M]) -> M:
    """Validate a dict (parsed TOML, possibly with flag overrides). Raises ValueError with one line."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ValueError(one_line(e)) from None


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file not found: {p}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {p} is not valid TOML: {e}") from None


def load_config(model: type[M], path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> M:
    """The file's keys, then `overrides` (e.g. from flags) on top; lists given as overrides replace the file's."""
    data = read_toml(path) if path is not None else {}
    data.update(overrides or {})
    return build_config(data, model)
