"""/v1/responses (OpenAI's Responses API): the request's prompt estimate and output limit, and the response's shapes,
streamed (the event sequence the official client reads) and not.

`input` is a string or a list of input items (messages with string or list-of-parts content, or other items whose
text is counted); `instructions` count toward the prompt. Stateful use is refused with a 400 naming the field:
`previous_response_id` (the state lives on whichever server answered before) and `background: true`; `store` is
accepted and nothing is stored.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from .protocol import BadRequest, body_model, flag, integer
from .tokens import IMAGE_TOKENS, MESSAGE_TOKENS, OUTPUT_PIECE, TokenCounter, chat_text, estimate_tokens, media_parts

DEFAULT_MAX_OUTPUT_TOKENS = 256
STATEFUL = ("previous_response_id", "background")
FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")  # each carries the response


@dataclass(frozen=True)
class ResponsesCall:
    model: str | None
    prompt_tokens: int  # instructions + input, by the caller's counter
    max_output_tokens: int | None  # as the client set it
    stream: bool
    instructions: str | None = None


def parse_responses(body: Any, *, strict: bool, count: TokenCounter = estimate_tokens) -> ResponsesCall:
    """Validate a responses body (strict: `model` may be omitted; lenient, the gateway: it is required).
    Raises BadRequest naming the field."""
    model = body_model(body, strict)
    for name in STATEFUL:
        if body.get(name) not in (None, False):
            raise BadRequest(
                f"'{name}' is not supported: responses are stateless here (send the whole conversation as 'input').",
                name,
            )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("'instructions' must be a string.", "instructions")
    items = body.get("input")
    text = _input_text(items)
    shape = body.get("text")  # NOTE: `text.format` is the Responses API's response_format
    rendered = {"tools": body.get("tools"), "response_format": shape.get("format") if isinstance(shape, dict) else None}
    tools = chat_text(rendered)
    messages = (len(items) if isinstance(items, list) else 1) + (instructions is not None)  # NOTE: each templated
    extra = MESSAGE_TOKENS * messages + IMAGE_TOKENS * (media_parts(items) if isinstance(items, list) else 0)
    return ResponsesCall(
        model=model,
        prompt_tokens=count("\n".join(t for t in (instructions, text, tools) if t)) + extra,
        max_output_tokens=integer(body, "max_output_tokens"),
        stream=flag(body, "stream"),
        instructions=instructions,
    )


def _input_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value or not all(isinstance(item, dict) for item in value):
        raise BadRequest("'input' must be a string or a non-empty array of input items (objects).", "input")
    parts: list[str] = []
    for item in value:
        for key in ("content", "text", "output", "arguments"):
            _texts(item.get(key), parts)
    return "\n".join(parts)


def _texts(value: Any, into: list[str]) -> None:
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, list):
        into += [p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str)]


def usage_tokens(response: Any) -> tuple[int, int] | None:
    """(input_tokens, output_tokens) from a response object's `usage`, None when it has none."""
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    got = usage.get("input_tokens"), usage.get("output_tokens")
    return got if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in got) else None  # type: ignore[return-value]


def sse_event(obj: dict[str, Any]) -> bytes:
    """One Responses stream event: `event: <type>` then its JSON data."""
    return b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


@dataclass
class ResponseReply:
    """One response's identity and its shapes: the streamed events in order, and the whole body."""

    model: str
    prompt_tokens: int
    max_output_tokens: int
    instructions: str | None = None
    id: str = field(default_factory=lambda: "resp_" + uuid.uuid4().hex)
    item_id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex)
    created_at: int = field(default_factory=lambda: int(time.time()))
    _seq: int = 0

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        return {"type": kind, "sequence_number": self._seq - 1, **fields}

    def _part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, text: str | None) -> dict[str, Any]:
        done = text is not None
        content = [self._part(text)] if text is not None else []
        status = "completed" if done else "in_progress"
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant", "content": content}

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    def response(self, output_tokens: int | None) -> dict[str, Any]:
        """The response object: in progress (None) or completed with `output_tokens` tokens."""
        done = output_tokens is not None
        text = OUTPUT_PIECE * output_tokens if output_tokens is not None else None
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": "completed" if done else "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": [self._item(text)] if done else [],
            "parallel_tool_calls": True,
            "temperature": 1.0,
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "metadata": {},
            "usage": None,
        }
        if output_tokens is not None:
            out["usage"] = {
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + output_tokens,
            }
        return out

    def head_events(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self.response(None)),
            self._event("response.in_progress", response=self.response(None)),
            self._event("response.output_item.added", output_index=0, item=self._item(None)),
            self._event("response.content_part.added", **self._where(), part=self._part("")),
        ]

    def delta_event(self, text: str = OUTPUT_PIECE) -> dict[str, Any]:
        return self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[])

    def tail_events(self, output_tokens: int) -> list[dict[str, Any]]:
        text = OUTPUT_PIECE * output_tokens
        return [
            self._event("response.output_text.done", **self._where(), text=text, logprobs=[]),
            self._event("response.content_part.done", **self._where(), part=self._part(text)),
            self._event("response.output_item.done", output_index=0, item=self._item(text)),
            self._event("response.completed", response=self.response(output_tokens)),
        ]
