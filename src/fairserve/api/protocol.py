"""OpenAI request parsing and response shapes for /v1/completions and /v1/chat/completions.

One parser, `parse_request`, with one set of field rules and messages and two modes:
- strict (`parse_call`: the emulator and `fairserve serve`, which generate from text): `prompt` is a string or a
  list with one string, `n` must be 1, `model` may be omitted;
- lenient (the gateway's `gateway.body.parse_body`, a proxy): `prompt` may also be several strings, token ids or
  lists of token ids, any `n` >= 1 is passed on, `model` is required; unknown fields pass through untouched.
Integers (`max_tokens`, `max_completion_tokens`, `n`) are at most `MAX_INT` = 2**31 - 1 in both modes.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from .tokens import IMAGE_TOKENS, MESSAGE_TOKENS, OUTPUT_PIECE, TokenCounter, chat_text, estimate_tokens, media_parts

DEFAULT_MAX_TOKENS = {False: 16, True: 256}  # completions, chat: OpenAI's / vLLM's defaults
# NOTE: vLLM keeps token counts in 32-bit signed integers; no model's context comes near it.
MAX_INT = 2**31 - 1
DONE = b"data: [DONE]\n\n"


class BadRequest(ValueError):
    """A request body refused with a 400; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class ParsedRequest:
    """What a server or the gateway reads from a request body."""

    chat: bool
    model: str | None
    prompt_tokens: int  # by the caller's counter, over every prompt (0 for an empty prompt)
    max_tokens: int | None  # as the client set it: chat's max_completion_tokens, else max_tokens
    n: int
    sequences: int  # the outputs it asks for, each up to max_tokens: prompts x max(n, best_of)
    stream: bool
    include_usage: bool  # the client asked for stream_options.include_usage
    prompt: str = ""  # completions, strict mode: the prompt text
    messages: tuple = ()  # chat: the messages, as sent
    ignore_eos: bool = False
    priority: int | None = None  # vLLM's `priority` (lower is served first), as the client named it


@dataclass(frozen=True)
class Call:
    """What a server (the emulator, `serve`) needs from a request body."""

    chat: bool
    model: str | None
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    prompt: str = ""  # completions: the prompt text
    messages: tuple = ()  # chat: the messages, as sent
    ignore_eos: bool = False
    priority: int | None = None


def parse_json(raw: bytes | str, *, surrogates: bool = False) -> Any:
    """The body's JSON, by orjson when it can (it refuses a few things json accepts: NaN, lone surrogates, huge
    ints). Raises BadRequest when it is not JSON, or (unless `surrogates`: a backend's answer, relayed as sent) when
    a string holds a lone UTF-16 surrogate (`"\\ud800"`): no UTF-8 encodes it, strict JSON readers refuse it, and
    a client's strings reach the usage log that billing reads."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # ValueError: also an int of over 4300 digits
        raise BadRequest("We could not parse the JSON body of your request. The body must be a JSON object.") from None
    if not surrogates:
        try:
            json.dumps(doc, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise BadRequest(
                "The request body holds a lone UTF-16 surrogate escape (such as \\ud800), which is not text: "
                "send valid Unicode."
            ) from None
    return doc


def parse_request(body: Any, chat: bool, *, strict: bool, count: TokenCounter = estimate_tokens) -> ParsedRequest:
    """Validate an OpenAI request body (see the module's docstring for the two modes); raises BadRequest."""
    model = body_model(body, strict)
    stream = flag(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise BadRequest(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options"
            )
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object.", "stream_options")
    ignore_eos = flag(body, "ignore_eos")
    flag(body, "echo")
    max_tokens = None
    for name in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        value = integer(body, name)
        if max_tokens is None:
            max_tokens = value
    n = integer(body, "n")
    if strict and n not in (None, 1):
        raise BadRequest("Only n=1 is supported.", "n")
    best_of = integer(body, "best_of")
    if chat:
        messages, texts = messages_field(body), 1
        extra = MESSAGE_TOKENS * len(messages) + IMAGE_TOKENS * media_parts(messages)
        prompt, prompt_tokens = "", count(chat_text(body)) + extra
    else:
        prompts = _prompts(body, strict)
        prompt = prompts[0] if strict else ""
        prompt_tokens = sum(len(p) if isinstance(p, list) else 1 if isinstance(p, int) else count(p) for p in prompts)
        # NOTE: a list of token ids is one prompt; a list of strings or of id lists is one prompt each
        texts = 1 if isinstance(body["prompt"], str) or all(is_token_id(p) for p in prompts) else len(prompts)
    usage = isinstance(options, dict) and options.get("include_usage") is True
    priority = priority_field(body)
    return ParsedRequest(
        chat=chat,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        n=n or 1,
        sequences=texts * max(n or 1, best_of or 1),
        stream=stream,
        include_usage=usage,
        prompt=prompt,
        messages=tuple(body["messages"]) if chat else (),
        ignore_eos=ignore_eos,
        priority=priority,
    )


def body_model(body: Any, strict: bool) -> str | None:
    """The `model` of a body that must be a JSON object (strict: it may be omitted). Raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string.", "model")
    if not strict and not model:
        raise BadRequest("Missing required parameter: 'model' (a non-empty string).", "model")
    return model


def priority_field(body: dict) -> int | None:
    """vLLM's `priority` as the request names it (None: it names none). Raises BadRequest."""
    priority = body.get("priority")
    bad = isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_INT
    if priority is not None and bad:
        raise BadRequest(
            f"'priority' must be an integer from {-MAX_INT} to {MAX_INT}, got {_short(priority)}.", "priority"
        )
    return priority


def parse_call(body: Any, chat: bool, default_max_tokens: int | None = None) -> Call:
    """A server's request (strict mode). Unknown fields (temperature, ...) are accepted and ignored. Without
    max_tokens: `default_max_tokens`, else OpenAI's defaults (16 for completions, 256 for chat)."""
    r = parse_request(body, chat, strict=True)
    return Call(
        chat=chat,
        model=r.model,
        prompt_tokens=max(1, r.prompt_tokens),
        max_tokens=r.max_tokens or default_max_tokens or DEFAULT_MAX_TOKENS[chat],
        stream=r.stream,
        include_usage=r.include_usage,
        prompt=r.prompt,
        messages=r.messages,
        ignore_eos=r.ignore_eos,
        priority=r.priority,
    )


def flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be a boolean.", name)
    return value is True


def integer(body: dict, name: str) -> int | None:
    """An optional integer field, 1..MAX_INT."""
    value = body.get(name)
    if value is None:
        return None
    # NOTE: orjson reads an integer past 64 bits as a float, hence "too large" for a float too
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_INT:
        raise BadRequest(f"'{name}' is too large: it must be at most {MAX_INT}, got {_short(value)}.", name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {_short(value)}.", name)
    if value < 1:
        raise BadRequest(f"'{name}' must be >= 1, got {_short(value)}.", name)
    return value


def _short(value: Any) -> str:
    """A field's value for an error message, cut to 40 characters (a 400-digit integer is not repeated)."""
    try:
        text = json.dumps(value)
    except (ValueError, TypeError):  # an int past Python's 4300-digit str() limit
        text = "a number"
    return text if len(text) <= 40 else text[:37] + "..."


def _prompts(body: dict, strict: bool) -> list:
    """A completions `prompt` as a list of prompts: strings, or (lenient) token ids and lists of token ids."""
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("Missing required parameter: 'prompt'.", "prompt")
    if strict:
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return prompt
        raise BadRequest("'prompt' must be a string or a list with one string.", "prompt")
    prompts = prompt if isinstance(prompt, list) else [prompt]
    if (
        isinstance(prompt, str)
        or isinstance(prompt, list)
        and all(
            isinstance(p, str) or is_token_id(p) or isinstance(p, list) and all(is_token_id(t) for t in p)
            for p in prompts
        )
    ):
        return prompts
    raise BadRequest(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists.", "prompt"
    )


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def messages_field(body: dict) -> list:
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
            raise BadRequest(f"messages[{i}].content must be a string or an array of parts.", f"messages[{i}].content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
                raise BadRequest(
                    f"messages[{i}].content[{j}] must be an object whose 'text', if any, is a string.",
                    f"messages[{i}].content",
                )
    return messages


def models_list(*names: str, loras: tuple[str, ...] = ()) -> dict[str, Any]:
    """The body of GET /v1/models for a server of these models, and LoRA adapters on the first (vLLM lists an
    adapter with the base model as its `parent`)."""

    def entry(name: str, parent: str | None) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "fairserve", "root": name, "parent": parent}

    return {"object": "list", "data": [entry(n, None) for n in names] + [entry(a, names[0]) for a in loras]}


def sse(obj: Any) -> bytes:
    """One server-sent event, `data: <compact JSON>\\n\\n`: by orjson (UTF-8), else by json for what orjson refuses
    (integers past 64 bits, lone surrogates: escaped)."""
    try:
        return b"data: " + orjson.dumps(obj) + b"\n\n"
    except (TypeError, orjson.JSONEncodeError):
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
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }

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
        return {
            **self._head(False),
            "choices": [{"index": 0, **content, "logprobs": None, "finish_reason": finish_reason}],
            "usage": self.usage(completion_tokens),
        }
