"""Reading trace files into raw records: CSV/JSONL containers, format detection, values.

Every error is a WorkloadError whose message starts with "FILE:LINE:" (or "FILE:").
"""

from __future__ import annotations

import csv
import datetime
import io
import itertools
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from .base import WorkloadError

# Per format: the (time, client, prompt, output) column names; client None = the trace has none.
COLUMNS: dict[str, tuple[str, str | None, str, str]] = {
    "fairserve": ("arrival_time_s", "client", "prompt_tokens", "output_tokens"),
    "azure": ("TIMESTAMP", None, "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", None, "Request tokens", "Response tokens"),
    "mooncake": ("timestamp", None, "input_length", "output_length"),
}
# Per format: optional columns/keys describing the prompt's shared prefix (docs/workloads.md, "Prefixes")
PREFIX_COLUMNS: dict[str, tuple[str, ...]] = {"fairserve": ("prefix_id", "prefix_tokens"), "mooncake": ("hash_ids",)}
CSV_FORMATS = ("fairserve", "azure", "burstgpt")
JSON_FORMATS = ("fairserve", "mooncake")
_JSON_SUFFIXES = {".jsonl", ".json", ".ndjson"}

# line number, time, client (or None), prompt, output, the prefix columns present (name -> raw value)
Record = tuple[int, Any, Any, Any, Any, dict[str, Any]]


def read_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: trace file not found") from None
    except IsADirectoryError:
        raise WorkloadError(f"{path}: is a directory, not a trace file") from None
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read trace file ({e.strerror})") from None
    if not text.strip():
        raise WorkloadError(f"{path}: trace file is empty")
    return text


def is_jsonl(path: Path, text: str) -> bool:
    """JSON lines or CSV: by extension, else by the first character."""
    if path.suffix.lower() in _JSON_SUFFIXES:
        return True
    if path.suffix.lower() == ".csv":
        return False
    return text.lstrip().startswith("{")


def _pick_format(path: Path, line: int, fmt: str, names: set[str], candidates: tuple[str, ...], what: str) -> str:
    def missing(f: str) -> list[str]:
        return [c for c in COLUMNS[f] if c is not None and c not in names]

    if fmt == "auto":
        for f in candidates:
            if not missing(f):
                return f
        known = "; ".join(f"{f}: {', '.join(c for c in COLUMNS[f] if c)}" for f in candidates)
        raise WorkloadError(
            f"{path}:{line}: cannot tell the trace format from the {what} {sorted(names)}; expected one of: {known}"
        )
    if fmt not in candidates:
        raise WorkloadError(f"{path}: {fmt} traces are not stored as {'JSONL' if what == 'keys' else 'CSV'}")
    if gone := missing(fmt):
        raise WorkloadError(f"{path}:{line}: {fmt} trace is missing {what} {', '.join(map(repr, gone))}")
    return fmt


def csv_records(path: Path, text: str, fmt: str) -> tuple[str, Iterator[Record]]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(row for row in reader if any(cell.strip() for cell in row))
    except csv.Error as e:
        raise WorkloadError(f"{path}:{reader.line_num}: malformed CSV ({e})") from None
    header = [cell.strip() for cell in header]
    fmt = _pick_format(path, reader.line_num, fmt, set(header), CSV_FORMATS, "columns")
    index = [header.index(c) if c is not None else None for c in COLUMNS[fmt]]
    extra = [(c, header.index(c)) for c in PREFIX_COLUMNS.get(fmt, ()) if c in header]

    def rows() -> Iterator[Record]:
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise WorkloadError(f"{path}:{reader.line_num}: malformed CSV ({e})") from None
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise WorkloadError(
                    f"{path}:{reader.line_num}: expected {len(header)} columns like the header, got {len(row)}"
                )
            fields = (row[i] if i is not None else None for i in index)
            yield cast(Record, (reader.line_num, *fields, {c: row[i] for c, i in extra if row[i].strip()}))

    return fmt, rows()


def jsonl_records(path: Path, text: str, fmt: str) -> tuple[str, Iterator[Record]]:
    objects = _json_objects(path, text)
    first_line, first = next(objects)
    fmt = _pick_format(path, first_line, fmt, set(first), JSON_FORMATS, "keys")
    keys = COLUMNS[fmt]

    def rows() -> Iterator[Record]:
        for line, obj in itertools.chain([(first_line, first)], objects):
            if gone := [k for k in keys if k is not None and k not in obj]:
                raise WorkloadError(f"{path}:{line}: missing key {', '.join(map(repr, gone))}")
            extra = {k: obj[k] for k in PREFIX_COLUMNS.get(fmt, ()) if obj.get(k) is not None}
            yield cast(Record, (line, *(obj[k] if k is not None else None for k in keys), extra))

    return fmt, rows()


def _json_objects(path: Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{path}:{line}: invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{path}:{line}: expected a JSON object per line")
        yield line, obj


def number(path: Path, line: int, what: str, value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        x = float(value)
    else:
        try:
            x = float(str(value).strip())
        except ValueError:
            raise WorkloadError(f"{path}:{line}: {what} is not a number: {value!r}") from None
    if not math.isfinite(x):
        raise WorkloadError(f"{path}:{line}: {what} is not a finite number: {value!r}")
    return x


def whole(path: Path, line: int, what: str, value: Any) -> int:
    x = number(path, line, what, value)
    if not x.is_integer():
        raise WorkloadError(f"{path}:{line}: {what} is not a whole number: {value!r}")
    return int(x)


_DATETIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(\.\d+)?\s*(Z|[+-]\d{2}:?\d{2})?")


def datetime_seconds(path: Path, line: int, what: str, value: Any) -> tuple[int, float]:
    """A datetime string such as "2023-11-16 18:15:46.6805900" (any number of fractional
    digits, optional UTC offset) as (whole seconds, fraction), so differences stay exact."""
    m = _DATETIME.fullmatch(str(value).strip())
    try:
        if m is None:
            raise ValueError
        date, hh, mm, ss, frac, tz = m.groups()
        if int(hh) > 23 or int(mm) > 59 or int(ss) > 60:
            raise ValueError
        seconds = datetime.date.fromisoformat(date).toordinal() * 86400 + int(hh) * 3600 + int(mm) * 60 + int(ss)
    except ValueError:
        raise WorkloadError(
            f"{path}:{line}: {what} is not a date-time like 2023-11-16 18:15:46.68: {value!r}"
        ) from None
    if tz and tz != "Z":
        offset = tz[1:].replace(":", "")
        seconds -= (1 if tz[0] == "+" else -1) * (int(offset[:2]) * 3600 + int(offset[2:]) * 60)
    return seconds, float(frac) if frac else 0.0


MOONCAKE_BLOCK_TOKENS = 512  # the tokens each of a Mooncake request's `hash_ids` stands for


def prefix_segments(path: Path, line: int, fmt: str, extra: dict[str, Any], prompt: int) -> tuple[tuple[str, int], ...]:
    """A row's shared prefix as `Arrival.prefix` segments: fairserve's (`prefix_id`, `prefix_tokens`), both or
    neither; Mooncake's `hash_ids`, one segment of 512 tokens per id (chained: an id names the whole prefix up to its
    block's end), the last one cut at the prompt's end."""
    if fmt == "fairserve" and extra:
        if len(extra) != 2:
            raise WorkloadError(
                f"{path}:{line}: prefix_id and prefix_tokens go together (got only {next(iter(extra))})"
            )
        name, tokens = str(extra["prefix_id"]).strip(), whole(path, line, "prefix_tokens", extra["prefix_tokens"])
        if not name:
            raise WorkloadError(f"{path}:{line}: prefix_id is empty")
        if not 1 <= tokens <= prompt:
            raise WorkloadError(
                f"{path}:{line}: prefix_tokens must be between 1 and prompt_tokens ({prompt}), got {tokens}"
            )
        return ((name, tokens),)
    if fmt == "mooncake" and extra:
        ids = extra["hash_ids"]
        if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in ids):
            raise WorkloadError(f"{path}:{line}: hash_ids must be a list of integers, got {ids!r}")
        size = MOONCAKE_BLOCK_TOKENS
        return tuple((str(h), min(size, prompt - j * size)) for j, h in enumerate(ids) if j * size < prompt)
    return ()
