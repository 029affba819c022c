"""Command-line value parsers shared by the `fairserve` subcommands."""

from __future__ import annotations

import argparse


def positive(kind: type, what: str, zero: bool = False):
    """An argparse type: a number of `kind` that must be > 0 (`zero`: >= 0)."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not (v >= 0 if zero else v > 0):
            raise argparse.ArgumentTypeError(f"must be {'>=' if zero else '>'} 0, got {text}")
        return v

    return parse
