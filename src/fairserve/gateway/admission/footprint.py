"""A request's footprint: the most it may use, computed once from its body (`body.parse_body`) and used by every
part that must bound it before the backend reports its usage: admission (the tokens it reserves on a backend), the
quota hold (gateway/quota/gate.py) and the ledger's first charge (`Request.prompt_tokens`, `Request.max_tokens`).

The output bound is the request's `max_tokens` (`max_completion_tokens`, `max_output_tokens`) or, when it sets
none, `default_max_tokens`, which is then sent upstream (`body.upstream_body`) so that the backend stops there too;
each sequence it asks for (every prompt of a list, times `n` or `best_of`) may produce that many.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_TOKENS = 512  # a request's output bound when it sets none (`default_max_tokens`)


@dataclass(frozen=True, slots=True)
class Footprint:
    prompt_tokens: int  # every prompt, message, tool and image of the request, by the gateway's counter
    output_tokens: int  # the bound of one sequence, as sent upstream
    sequences: int = 1  # outputs generated (0: embeddings)

    @property
    def max_output(self) -> int:
        """The bound of all its output."""
        return self.output_tokens * self.sequences

    @property
    def tokens(self) -> int:
        """Prompt and output bound: what it reserves on a backend and holds on a quota."""
        return self.prompt_tokens + self.max_output
