"""Profiling any OpenAI-compatible server through HTTP (`fairserve profile --engine http --url URL`), from streamed
tokens. A pacer request decodes throughout; a row's requests (streamed completions, `ignore_eos`, `max_tokens` = the
row's output) are sent together while it does, so they are admitted at one step boundary, which the pacer's tokens
mark. A prefill pass runs from that boundary to its requests' first tokens (a batch that reaches the server over
two steps is prefilled in two passes, each measured as its own row); a decode step is the median
gap between a request's consecutive tokens while the row's requests and the pacer all stream (a batch one larger).
Less exact than in-process: each time includes the server's streaming and the client's reading; a server that sends
several tokens in one chunk hides its steps. The pool and limits are not visible through HTTP: they come from the
flags (`--kv-tokens`, `--max-num-seqs`, `--max-batched-tokens`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx

from ..sim.engine_profile import EngineProfile
from .grid import Shape, grid, row

TOGETHER_S = 0.002  # first tokens this close came from one prefill pass, at least
WORD = "hello "  # about one token per word for common tokenizers; the server's usage says how many


async def _stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], key: str | None, times: list[float], stop: asyncio.Event
) -> int:
    """One streamed completion: the time of each chunk with text is appended to `times` as it arrives (until the
    stream ends or `stop` is set); returns the prompt's tokens as the server counted them (0 if it did not say)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    prompt_tokens = 0
    async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}")
        async for line in r.aiter_lines():
            if stop.is_set():
                break
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
            if any(c.get("text") for c in chunk.get("choices", [])):
                times.append(time.perf_counter())
    return prompt_tokens


def _body(model: str, prompt: int, output: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": WORD * prompt,
        "max_tokens": output,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


async def measure(
    client: httpx.AsyncClient, url: str, model: str, shape: Shape, key: str | None
) -> tuple[list[tuple[int, float]], list[float], int]:
    """One repeat of a row: the prefill passes seen as (requests, seconds), the decode steps seen, and the prompt's
    tokens as the server counted them.

    NOTE: a pacer request decodes throughout, so the batch arrives during a decode step and is admitted at a step
    boundary, which the pacer's tokens mark. Requests whose first tokens come together were prefilled in one pass
    (a batch that reaches the server over two steps is prefilled in two); a pass runs from the last boundary before
    it (a pacer token, or the previous pass's first tokens) to its first tokens. The decode steps are the gaps
    between a batch request's tokens while the whole batch and the pacer stream: batch + 1 requests."""
    pacer: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(_stream(client, url, _body(model, 8, 4 * shape.output + 64), key, pacer, stop))
    while len(pacer) < 2:
        if task.done():
            await task
            raise RuntimeError(f"{url}: the pacer request ended before the batch was sent")
        await asyncio.sleep(0.002)
    times: list[list[float]] = [[] for _ in range(shape.batch)]
    counts = await asyncio.gather(
        *(_stream(client, url, _body(model, shape.prompt, shape.output), key, t, asyncio.Event()) for t in times)
    )
    stop.set()
    await task
    if not all(times):
        raise RuntimeError(f"{url}: a streamed completion sent no tokens")
    # NOTE: first tokens closer than half a decode step came from one pass (the client reads the streams one by one)
    gaps = [b - a for t in times for a, b in itertools.pairwise(t)]
    together = max(TOGETHER_S, statistics.median(gaps) / 2 if gaps else 0.0)
    passes: list[list[float]] = []
    for first in sorted(t[0] for t in times):
        if passes and first - passes[-1][-1] <= together:
            passes[-1].append(first)
        else:
            passes.append([first])
    seen: list[tuple[int, float]] = []
    for group in passes:
        marks = [t for t in pacer if t < group[0] - together] + [g[-1] for g in passes if g[-1] < group[0]]
        if marks:
            seen.append((len(group), statistics.median(group) - max(marks)))
    until = min(min(t[-1] for t in times), pacer[-1])  # NOTE: the whole batch and the pacer still streaming
    steps = [b - a for t in times for a, b in itertools.pairwise(t) if b <= until]
    return seen, steps, max(counts) or shape.prompt


def profile(
    url: str,
    model: str,
    kv_tokens: int,
    max_num_seqs: int,
    max_batched_tokens: int | None,
    repeats: int,
    key: str | None = None,
    log: Callable[[str], None] = print,
    sizes: dict[str, Any] | None = None,
) -> EngineProfile:
    async def go() -> EngineProfile:
        rows = []
        passes: dict[tuple[int, int], list[float]] = {}  # (prompt tokens, requests) -> seconds of its passes
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=max_num_seqs + 4)) as client:
            # NOTE: warm-up with a full batch, so that the pool holds a connection for each request of a row
            warm: list[list[float]] = [[] for _ in range(max_num_seqs)]
            await asyncio.gather(*(_stream(client, url, _body(model, 8, 2), key, t, asyncio.Event()) for t in warm))
            shapes = grid(max_num_seqs, max_batched_tokens, None, **(sizes or {}))
            if not shapes:
                raise ValueError("no row of the grid fits --max-num-seqs / --max-batched-tokens")
            for shape in shapes:
                steps: list[float] = []
                for _ in range(repeats):
                    seen, gaps, prompt_tokens = await measure(client, url, model, shape, key)
                    for n, pass_s in seen:
                        passes.setdefault((prompt_tokens, n), []).append(pass_s)
                    steps += gaps
                if not steps:
                    raise RuntimeError(f"{url}: no decode step seen for a batch of {shape.batch}")
                # NOTE: the decode steps of the batch with the pacer (batch + 1); its prefill column is not fitted
                dec = row(Shape(prompt_tokens, shape.batch + 1, shape.output), [0.0], steps)
                rows.append(replace(dec, prefill_s=dec.decode_step_s, prefill_fitted=False))
                log(f"prompt {prompt_tokens:>5} batch {shape.batch:>3}: decode step {dec.decode_step_s * 1e3:7.2f} ms")
        for (prompt, n), seconds in sorted(passes.items()):
            # NOTE: a prefill pass (output 1: its decode column is not fitted)
            rows.append(row(Shape(prompt, n, 1), seconds, [statistics.median(seconds)]))
            log(f"prompt {prompt:>5} batch {n:>3}: prefill {statistics.median(seconds) * 1e3:8.2f} ms")
        return EngineProfile(
            kv_tokens=kv_tokens,
            rows=tuple(rows),
            engine={"kind": "http", "url": url, "model": model},
            max_num_seqs=max_num_seqs,
            max_batched_tokens=max_batched_tokens,
        )

    return asyncio.run(go())
