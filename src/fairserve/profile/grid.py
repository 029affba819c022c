"""The rows a profile measures and how one row's repeats become one `ProfileRow`.

A row is a batch of `batch` requests of `prompt` tokens, all prefilled in one pass, then decoded `output - 1` steps
together (each request asks for `output` tokens; the first comes with the prefill). The grid spans the batch sizes
up to the engine's `max_num_seqs` and prompts whose batch fits its prefill budget (`max_batched_tokens`), so that
the prefill is one pass; rows that do not fit are left out."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..sim.profile_fit import ProfileRow

PROMPTS = (32, 128, 512)
BATCHES = (1, 2, 4, 8, 16)
OUTPUT = 16  # tokens asked per request: 15 decode steps per row


@dataclass(frozen=True)
class Shape:
    prompt: int
    batch: int
    output: int = OUTPUT


def grid(
    max_num_seqs: int,
    max_batched_tokens: int | None,
    max_model_len: int | None,
    prompts: Sequence[int] = PROMPTS,
    batches: Sequence[int] = BATCHES,
    output: int = OUTPUT,
) -> list[Shape]:
    """The rows that fit the engine's limits, smallest first."""
    out = []
    for p in prompts:
        if max_model_len is not None and p + output > max_model_len:
            continue
        for b in batches:
            if b > max_num_seqs or (max_batched_tokens is not None and b * p > max_batched_tokens):
                continue
            out.append(Shape(p, b, output))
    return out


def row(shape: Shape, prefills: Iterable[float], steps: Iterable[float]) -> ProfileRow:
    """One row from its repeats: the median prefill pass and the median decode step."""
    return ProfileRow(shape.prompt, shape.output, shape.batch, statistics.median(prefills), statistics.median(steps))
