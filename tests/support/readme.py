"""The README's code blocks, as the README test runs them: every ```sh and ```python block is preceded by an
annotation, `<!-- readme: run -->` (optionally `; replace OLD => NEW` pairs: the documented substitutions of
placeholders) or `<!-- readme: skip (why) -->`, so a block cannot go untested by accident."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_BLOCK = re.compile(r"(?:<!-- readme: (?P<note>.*?) -->\n)?```(?P<lang>sh|python)\n(?P<body>.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    line: int  # where it starts in the README (1-based)
    lang: str
    body: str
    run: bool | None  # None: no annotation
    why: str = ""  # for a skipped block
    replace: tuple[tuple[str, str], ...] = ()

    @property
    def code(self) -> str:
        body = self.body
        for old, new in self.replace:
            body = body.replace(old, new)
        return body


def blocks(text: str | None = None) -> list[Block]:
    text = README.read_text() if text is None else text
    out = []
    for m in _BLOCK.finditer(text):
        note, line = m.group("note"), text.count("\n", 0, m.start("body"))
        if note is None:
            out.append(Block(line, m.group("lang"), m.group("body"), None))
        elif note.startswith("skip"):
            out.append(Block(line, m.group("lang"), m.group("body"), False, note.removeprefix("skip").strip(" ()")))
        else:
            verb, *subs = (s.strip() for s in note.split(";"))
            assert verb == "run", f"README line {line}: unknown annotation {note!r}"
            pairs = tuple(tuple(s.removeprefix("replace").strip().split(" => ", 1)) for s in subs)
            out.append(Block(line, m.group("lang"), m.group("body"), True, replace=pairs))  # type: ignore[arg-type]
    return out
