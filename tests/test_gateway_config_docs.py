"""The configuration table of docs/gateway.md against the code: every key of `GatewayConfig` has its row, and a
row names exactly the flags `fairserve gateway` defines for its keys (none: "—")."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from fairserve.gateway.cli import add_parser
from fairserve.gateway.config import GatewayConfig

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parent.parent / "docs" / "gateway.md"
LISTS = {"backend": "backends", "tenant": "tenants", "group": "groups", "model": "models"}  # the repeated flags


def table() -> list[tuple[set[str], set[str]]]:
    """(keys, flags) of each row of the Configuration section's table."""
    text = DOC.read_text()
    section = text[text.index("\n## Configuration\n") :]
    section = section[: section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = re.split(r"(?<!\\)\|", line)[1:]
            rows.append((set(re.findall(r"`(\w+)`", cells[0])), set(re.findall(r"--[a-z0-9-]+", cells[1]))))
    return rows


def flags_by_key() -> dict[str, set[str]]:
    parser = argparse.ArgumentParser()
    gateway = add_parser(parser.add_subparsers())
    out: dict[str, set[str]] = {}
    for action in gateway._actions:
        key = action.dest if action.dest in GatewayConfig.model_fields else LISTS.get(action.dest)
        if key is not None:
            out.setdefault(key, set()).update(s for s in action.option_strings if s.startswith("--"))
    return out


def test_every_key_has_a_row_naming_its_flags():
    rows, flags = table(), flags_by_key()
    documented = [k for keys, _ in rows for k in keys]
    assert sorted(set(GatewayConfig.model_fields) - set(documented)) == [], "keys without a row"
    assert sorted(set(documented) - set(GatewayConfig.model_fields)) == [], "rows of keys that do not exist"
    assert len(documented) == len(set(documented)), "a key in two rows"
    for keys, named in rows:
        assert named == set().union(*(flags.get(k, set()) for k in keys)), (sorted(keys), named)
