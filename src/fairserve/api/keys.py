"""One declaration per configuration key. A key's field says, through `key(...)`, everything about it: its default and
bounds (pydantic's), its help, its command-line flag (derived from its name unless given), whether a live reload
applies it or why only a restart does, and its row in the docs. From the fields come the flags (`add_flags`,
`flag_overrides`), the live and restart-only sets (`reload_keys`) and the docs' table (`table`), so adding a key is
one field plus the line in the part that uses it.

A flag is `--NAME` with the key's `_` as `-` and a trailing `_s` (seconds) dropped: `queue_ttl_s` → `--queue-ttl`; a
boolean whose default is true is turned off with `--no-NAME`. A list key (`tenants`) is given by a repeated flag
(`--tenant`) whose values its `read` turns into the key's value.
"""

from __future__ import annotations

import argparse
import functools
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


@dataclass(frozen=True)
class Key:
    """What a config field declares beyond its type, default and bounds."""

    help: str  # one line: `--help`, the JSON schema's description and, unless `doc` is given, the docs' row
    flag: str | None  # the flag's name; None: the file only
    metavar: str | None  # how `--help` and the docs show the flag's value (None: from the type)
    restart: str | None  # why only a restart applies it; None: a live reload does
    doc: str | None  # the docs row's text (Markdown), when it says more than `help`
    shown: str | None  # the default as the docs and `--help` show it (None: the value itself)
    read: Callable[[list[str]], Any] | None  # a repeated flag: its values → the key's value


def key(
    default: Any = PydanticUndefined,
    *,
    help: str,
    flag: str | bool = True,
    metavar: str | None = None,
    restart: str | None = None,
    doc: str | None = None,
    shown: str | None = None,
    read: Callable[[list[str]], Any] | None = None,
    **bounds: Any,
) -> Any:
    """A config field (pydantic's `Field(default, **bounds)`) and what it declares: `flag` True derives the flag's
    name, False gives none, a string names it; `read` makes it a repeated flag; `restart` says why only a restart
    applies the key."""
    field: FieldInfo = Field(default, description=help, **bounds)
    name = flag if isinstance(flag, str) else None
    # NOTE: pydantic keeps metadata it does not know and ignores it: the declaration travels with the field
    field.metadata.append(Key(help, name if flag is not False else None, metavar, restart, doc, shown, read))
    if flag is True:
        field.metadata.append(_DERIVE)
    return field


_DERIVE = object()  # marks a field whose flag is named from its key


def declared(model: type[BaseModel]) -> Iterator[tuple[str, FieldInfo, Key]]:
    """Each field of `model` and its declaration, in the model's order (TypeError naming a field declared without
    `key(...)`: every key says its help)."""
    for name, field in model.model_fields.items():
        found = [m for m in field.metadata if isinstance(m, Key)]
        if not found:
            raise TypeError(f"{model.__name__}.{name}: declare it with fairserve.api.keys.key(...)")
        k = found[-1]
        if k.flag is None and any(m is _DERIVE for m in field.metadata):
            k = replace(k, flag=flag_name(name, field))
        yield name, field, k


def flag_name(name: str, field: FieldInfo) -> str:
    stem = name.removesuffix("_s").replace("_", "-")
    return f"--no-{stem}" if _base(field.annotation) is bool and field.default is True else f"--{stem}"


def reload_keys(model: type[BaseModel]) -> tuple[frozenset[str], dict[str, str]]:
    """(the keys a live reload applies, the keys only a restart applies and why)."""
    live, restart = _reload_keys(model)
    return live, dict(restart)


@functools.cache
def _reload_keys(model: type[BaseModel]) -> tuple[frozenset[str], tuple[tuple[str, str], ...]]:
    """Made once per model: a reload checks them on the event loop (0.4 ms to make, for the gateway's)."""
    restart = {name: k.restart for name, _, k in declared(model) if k.restart is not None}
    return frozenset(model.model_fields) - set(restart), tuple(restart.items())


def add_flags(parser: argparse.ArgumentParser, model: type[BaseModel], more: dict[str, str] | None = None) -> None:
    """A flag for every key of `model` that declares one; `more`: text added to a key's `--help` that is known only
    when the parser is made (the policies registered)."""
    for name, field, k in declared(model):
        if k.flag is None:
            continue
        text = k.help + (f": {more[name]}" if more and name in more else "")
        base = _base(field.annotation)
        if k.read is not None:
            parser.add_argument(k.flag, action="append", dest=name, metavar=k.metavar, help=f"{_pct(text)}; repeat")
        elif base is bool:
            on = field.default is not True
            state = "off by default" if on else "on by default: this flag turns it off"
            parser.add_argument(
                k.flag,
                dest=name,
                action="store_true" if on else "store_false",
                default=None,
                help=f"{_pct(text)} ({state})",
            )
        else:
            choices = typing.get_args(base) if typing.get_origin(base) is Literal else None
            parser.add_argument(
                k.flag,
                dest=name,
                type=base if base in (int, float) else str,
                choices=choices,
                metavar=None if choices else metavar(name, field, k),
                help=f"{_pct(text)} (default {_pct(_plain(shown(field, k)))})",
            )


def flag_overrides(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The keys the command line sets (flags not given are None), repeated flags read into their keys' values."""
    out: dict[str, Any] = {}
    for name, _, k in declared(model):
        value = getattr(args, name, None)
        if value is None or (k.read is not None and not value):
            continue
        out[name] = k.read(value) if k.read is not None else value
    return out


def metavar(name: str, field: FieldInfo, k: Key) -> str | None:
    """How the flag's value is shown: the declared metavar, else `S` (seconds), `N`, `X`, the choices or `TEXT`."""
    base = _base(field.annotation)
    if k.metavar is not None or base is bool:
        return k.metavar
    if typing.get_origin(base) is Literal:
        return "|".join(map(str, typing.get_args(base)))
    if base is float and name.endswith("_s"):
        return "S"
    return {int: "N", float: "X"}.get(base, "TEXT")


def shown(field: FieldInfo, k: Key) -> str:
    """A key's default as the docs and `--help` show it."""
    if k.shown is not None:
        return k.shown
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def table(model: type[BaseModel], reloads: bool = True) -> str:
    """The docs' table of `model`'s keys, one row each in the model's order (Markdown); `reloads`: the server
    applies a configuration live, so a row says when only a restart applies its key."""
    rows = ["| key | flag | default | what it sets |", "|---|---|---|---|"]
    for name, field, k in declared(model):
        if k.flag is None:
            flag = "—"
        else:
            value = metavar(name, field, k) or ""
            flag = f"`{k.flag}{' ' + value if value else ''}`" + (" (repeat)" if k.read is not None else "")
        text = k.doc or k.help
        if reloads and k.restart is not None:
            text += f" (restart only: {k.restart})"
        rows.append(f"| `{name}` | {_cell(flag)} | {_cell(_code(shown(field, k)))} | {_cell(text)} |")
    return "\n".join(rows) + "\n"


def _base(annotation: Any) -> Any:
    """`X | None` → X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _plain(text: str) -> str:
    """A default as `--help` shows it: no Markdown, a string without its quotes unless it is empty."""
    text = text.replace("`", "")
    return text[1:-1] if len(text) > 2 and text[0] == text[-1] == '"' else text


def _pct(text: str) -> str:
    return text.replace("%", "%%")  # NOTE: argparse formats help with %


def _code(text: str) -> str:
    """A default that is a string or a collection is code (`127.0.0.1:8080`, `[]`); a number or a word is not."""
    if text.startswith('"') and text != '""':
        return f"`{text[1:-1]}`"
    return f"`{text}`" if text[:1] in '"[{' else text


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # NOTE: a pipe in a cell ends it


BEGIN = "<!-- keys: {} (made from its fields: scripts/config_tables.py) -->\n"
END = "<!-- /keys -->"


def in_doc(text: str, model: type[BaseModel], reloads: bool = True) -> str:
    """`text` (a Markdown page) with the table of `model` put between its markers; ValueError if it has none."""
    begin = BEGIN.format(model.__name__)
    start = text.index(begin) + len(begin) if begin in text else -1
    end = text.find(END, start)
    if start < 0 or end < 0:
        raise ValueError(f"no {begin.strip()} ... {END} block")
    return text[:start] + table(model, reloads) + text[end:]
