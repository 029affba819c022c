"""Data types shared by the synthetic workloads and the trace loaders."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_KV_TOKENS = 10_000
DEFAULT_LATENCY_PROFILE = "a10g-llama2-7b"


class WorkloadError(ValueError):
    """A workload could not be built or a trace could not be read.

    The message is meant for a human: it names the workload or the file (and the
    line, where there is one) and says what is wrong.
    """


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request: when it arrives, who sends it, and how long it is."""

    arrival_s: float  # seconds from start
    client: str
    prompt_tokens: int  # >= 1
    output_tokens: int  # >= 1; the simulated client sends max_tokens = output_tokens
    # the prompt's shared prefix as segments (id, tokens), each id naming everything up to its segment's end:
    # requests whose prefixes agree on a segment share the prompt tokens up to its end (docs/workloads.md)
    prefix: tuple[tuple[str, int], ...] = ()
    # the id a later prompt's segment gives what follows this prefix, its answer included (a conversation's next
    # turn declares it: that prompt shares this answer's tokens); None: nothing later shares them
    continued_as: str | None = None


@dataclass(frozen=True)
class Workload:
    """A list of arrivals sorted by time (stable: ties keep generation/file order)."""

    name: str
    arrivals: list[Arrival]
    duration_s: float
    weights: dict[str, float] | None = None  # per tenant or group path, for weighted VTC
    kv_tokens: int | None = None  # engine KV pool the paper used; None = DEFAULT_KV_TOKENS
    latency_profile: str | None = None  # None = DEFAULT_LATENCY_PROFILE
    priorities: dict[str, int] | None = None  # per tenant or group path (lower is served first); None: all at 0
