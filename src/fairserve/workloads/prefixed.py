"""Named workloads whose prompts share prefixes (`Arrival.prefix`), for the simulator's prefix cache and the
policies that order by it (lpm, dlpm): docs/workloads.md, "Workloads with shared prefixes".

- `system-prompts`: N clients, each with its own P-token system prompt, then a Q-token question; O output tokens.
- `conversations`: N clients, each in multi-turn conversations: a turn's prompt is the previous turn's prompt, its
  answer and a new message (the answer's blocks are named by the next turn's segment: that turn finds them cached).
- `document`: one D-token document asked Q-token questions by every client.
- `no-sharing`: the `system-prompts` sizes, every prompt its own (nothing to share).
- `prefix-mix`: half the clients with private system prompts, half sharing nothing.

By default 8 clients, a 1,000-token system prompt (document, first message), 64-token questions (messages), 32
output tokens, 1 request/s per client (uniform spacing after a random phase per client) for 60 s: about 8,800
prompt and output tokens of demand per second, beyond what the A10G preset serves; 8 system prompts with their
questions and answers fill 8,768 tokens of KV pool. The sizes are parameters of `prefix_workload`."""

from __future__ import annotations

import math

import numpy as np

from .base import Arrival, Workload, WorkloadError

PREFIX_WORKLOADS: tuple[str, ...] = ("system-prompts", "conversations", "document", "no-sharing", "prefix-mix")


def _times(rng: np.random.Generator, rate: float, duration_s: float) -> list[float]:
    gap = 1.0 / rate
    n = int(rate * duration_s)
    return (rng.uniform(0.0, gap) + gap * np.arange(n)).tolist()


def prefix_workload(
    kind: str,
    *,
    clients: int = 8,
    system_tokens: int = 1000,
    question_tokens: int = 64,
    output_tokens: int = 32,
    rate: float = 1.0,
    duration_s: float = 60.0,
    turns: int = 4,
    seed: int = 0,
) -> Workload:
    """The workload `kind` (one of `PREFIX_WORKLOADS`) with these sizes: `clients` clients each sending `rate`
    requests/s for `duration_s` s; `system_tokens` is the system prompt (or the document, or a conversation's first
    message), `question_tokens` the question (or each later message), `output_tokens` every answer; `turns` per
    conversation."""
    if kind not in PREFIX_WORKLOADS:
        raise WorkloadError(f"unknown workload {kind!r}; valid names: {', '.join(PREFIX_WORKLOADS)}")
    if min(clients, system_tokens, question_tokens, output_tokens, turns) < 1 or not rate > 0:
        raise WorkloadError(f"workload {kind!r}: sizes must be >= 1 and the rate > 0")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise WorkloadError(f"workload {kind!r}: duration_s must be a positive number")
    rng = np.random.default_rng(seed)
    arrivals: list[Arrival] = []
    for i in range(clients):
        name = f"client-{i}"
        sharing = kind != "no-sharing" and not (kind == "prefix-mix" and i % 2)
        for k, t in enumerate(_times(rng, rate, duration_s)):
            if kind == "conversations":
                arrivals.append(
                    _turn(
                        t, name, f"{name}/conv-{k // turns}", k % turns, system_tokens, question_tokens, output_tokens
                    )
                )
                continue
            prompt = system_tokens + question_tokens
            prefix: tuple[tuple[str, int], ...] = ()
            if sharing:
                prefix = (("document" if kind == "document" else f"{name}/system", system_tokens),)
            arrivals.append(Arrival(t, name, prompt, output_tokens, prefix))
    arrivals.sort(key=lambda a: a.arrival_s)
    return Workload(kind, arrivals, duration_s)


def _turn(t: float, client: str, conv: str, turn: int, first: int, message: int, answer: int) -> Arrival:
    """Turn `turn` (from 0) of a conversation: its prompt is every earlier prompt, answer and message, then its own
    message; declared as chained segments so that the next turn shares it (docs/workloads.md, "Prefixes"), and its
    answer continued as the next turn's segment, so that the next turn shares that too."""
    segments = [(f"{conv}/0", first)]
    for j in range(1, turn + 1):
        segments.append((f"{conv}/{j}", answer + message))  # the previous answer and this turn's message
    prompt = first + turn * (answer + message)
    return Arrival(t, client, prompt, answer, tuple(segments), continued_as=f"{conv}/{turn + 1}")


def make_prefix_workload(name: str, seed: int = 0, duration_s: float | None = None) -> Workload:
    """The named workload with its default sizes (`duration_s` shortens or lengthens it)."""
    if duration_s is None:
        return prefix_workload(name, seed=seed)
    return prefix_workload(name, seed=seed, duration_s=duration_s)
