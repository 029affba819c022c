"""Writes the configuration tables of the docs from the keys' declarations (`fairserve.api.keys`): the gateway's in
docs/gateway.md, `fairserve serve`'s in docs/engines.md. Run after adding or changing a key:
`.venv/bin/python scripts/config_tables.py` (`--check`: exit 1 if a table is out of date)."""

from __future__ import annotations

import sys
from pathlib import Path

from fairserve.api.keys import in_doc
from fairserve.gateway.settings.config import GatewayConfig
from fairserve.serve.config import ServeConfig

DOCS = Path(__file__).resolve().parents[1] / "docs"
TABLES = [(DOCS / "gateway.md", GatewayConfig, True), (DOCS / "engines.md", ServeConfig, False)]


def main(argv: list[str]) -> int:
    stale = []
    for path, model, reloads in TABLES:
        text = path.read_text()
        made = in_doc(text, model, reloads)
        if made != text:
            stale.append(path.name)
            if "--check" not in argv:
                path.write_text(made)
    if stale:
        print(f"{'out of date' if '--check' in argv else 'written'}: {', '.join(stale)}")
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
