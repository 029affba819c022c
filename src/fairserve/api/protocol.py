"""OpenAI request parsing and response shapes for /v1/completions and /v1/chat/completions."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .tokens import OUTPUT_PIECE, estimate_tokens, messages_text

DEFAULT_MAX_TOKENS = {False: 16, True: 256}     # completions, chat: OpenAI's / vLLM's defaults
DONE = b"data: [DONE]\n\n"


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class Call:
    """What the emulator needs from a request body."""

    chat: bool
    model: str | None
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    prompt: str = ""                    # completions: the prompt text
    messages: tuple = ()                # chat: the messages, as sent
    ignore_eos: bool = False


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("We could not parse the JSON body of your request. The body must be a JSON object.") \
            from None


def parse_call(body: Any, chat: bool, default_max_tokens: int | None = None) -> Call:
    """Validate an OpenAI request body. Unknown fields (temperature, ...) are accepted and ignored. Without
    max_tokens: `default_max_tokens`, else OpenAI's defaults (16 for completions, 256 for chat)."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string.", "model")
    text = _messages(body) if chat else _prompt(body)
    max_tokens = default_max_tokens or DEFAULT_MAX_TOKENS[chat]
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    for name in names:
        if body.get(name) is not None:
            max_tokens = _integer(body, name, 1)
            break
    n = body.get("n")
    if n is not None and (_integer(body, "n", 1) != 1):
        raise BadRequest("Only n=1 is supported by the emulator.", "n")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean.", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise BadRequest("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                             "stream_options")
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object.", "stream_options")
        include_usage = options.get("include_usage") is True
    for flag in ("ignore_eos", "echo"):
        if body.get(flag) is not None and not isinstance(body[flag], bool):
            raise BadRequest(f"'{flag}' must be a boolean.", flag)
    return Call(chat=chat, model=model, prompt_tokens=max(1, estimate_tokens(text)), max_tokens=max_tokens,
                stream=bool(stream), include_usage=include_usage, prompt="" if chat else text,
                messages=tuple(body["messages"]) if chat else (), ignore_eos=body.get("ignore_eos") is True)


def _prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, str):
        return prompt
    if prompt is None:
        raise BadRequest("Missing required parameter: 'prompt'.", "prompt")
    raise BadRequest("'prompt' must be a string or a list with one string.", "prompt")


def _messages(body: dict) -> str:
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("Missing required parameter: 'messages'.", "messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array.", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'.", f"messages[{i}]")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(f"messages[{i}].content must be a string or an array of parts.",
                             f"messages[{i}].content")
    return messages_text(messages)


def _integer(body: dict, name: str, minimum: int) -> int:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {json.dumps(value)}.", name)
    if value < minimum:
        raise BadRequest(f"'{name}' must be >= {minimum}, got {value}.", name)
    return value


def models_list(*names: str) -> dict[str, Any]:
    """The body of GET /v1/models for a server of these models."""
    return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "fairserve"}
                                       for n in names]}


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Reply:
    """One response's identity and the OpenAI shapes of its chunks and body."""

    chat: bool
    model: str
    prompt_tokens: int
    include_usage: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens}

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        out = {**self._head(True), "choices": [{"index": 0, **choice, "logprobs": None}]}
        if self.include_usage:
            out["usage"] = None
        return out

    def role_chunk(self) -> dict[str, Any]:
        return self._chunk({"delta": {"role": "assistant", "content": ""}, "finish_reason": None})

    def token_chunk(self, last: bool, text: str = OUTPUT_PIECE, finish_reason: str = "length") -> dict[str, Any]:
        content = {"delta": {"content": text}} if self.chat else {"text": text}
        return self._chunk({**content, "finish_reason": finish_reason if last else None})

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        return {**self._head(True), "choices": [], "usage": self.usage(completion_tokens)}

    def body(self, completion_tokens: int, text: str | None = None, finish_reason: str = "length") -> dict[str, Any]:
        text = OUTPUT_PIECE * completion_tokens if text is None else text
        content = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        return {**self._head(False), "choices": [{"index": 0, **content, "logprobs": None,
                                                  "finish_reason": finish_reason}],
                "usage": self.usage(completion_tokens)}
