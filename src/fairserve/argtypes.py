"""Command-line value parsers shared by the `fairserve` subcommands."""
from __future__ import annotations

import argparse


def parse_weights(text: str | None, flag: str = "--weights") -> dict[str, float] | None:
    """`client=weight,...` with every weight > 0; None for no text. Raises ValueError with one line."""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        client, _, value = (x.strip() for x in part.partition("="))
        try:
            weight = float(value)
        except ValueError:
            weight = 0.0
        if not client or not weight > 0:
            raise ValueError(f"bad {flag} entry {part!r}: expected CLIENT=WEIGHT with WEIGHT > 0")
        out[client] = weight
    return out


def positive(kind: type, what: str):
    """An argparse type: a number of `kind` that must be > 0."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return v
    return parse
