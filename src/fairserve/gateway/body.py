"""What the gateway reads from OpenAI request and response bodies: validation, token estimates, usage."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from ..api.tokens import TokenCounter, estimate_tokens, messages_text

CHAT, COMPLETIONS = "chat", "completions"
PATHS = {CHAT: "/v1/chat/completions", COMPLETIONS: "/v1/completions"}


class BodyError(ValueError):
    """A request body the gateway refuses (400). `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def loads(data: bytes | str) -> Any:
    """JSON, by orjson when it can (it refuses a few things json accepts: NaN, lone surrogates, huge ints)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


@dataclass(slots=True)
class Parsed:
    body: dict[str, Any]
    stream: bool
    wants_usage: bool          # the client itself asked for stream_options.include_usage
    prompt_tokens: int         # the gateway's estimate
    max_tokens: int | None     # as the client set it (max_completion_tokens or max_tokens)
    n: int
    raw: bytes = b""           # the body as the client sent it


def _int_field(body: dict[str, Any], name: str, low: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise BodyError(f"'{name}' must be an integer >= {low}", name)
    return v


def _prompt_tokens(prompt: Any, count: TokenCounter) -> int:
    """A completions `prompt`: a string, a list of strings, a list of token ids, or a list of such lists."""
    if isinstance(prompt, str):
        return count(prompt)
    if isinstance(prompt, list):
        total = 0
        for p in prompt:
            if isinstance(p, str):
                total += count(p)
            elif isinstance(p, int) and not isinstance(p, bool):
                total += 1
            elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                total += len(p)
            else:
                raise BodyError("'prompt' must be a string, a list of strings or a list of token ids", "prompt")
        return total
    raise BodyError("'prompt' must be a string, a list of strings or a list of token ids", "prompt")


def parse_body(raw: bytes, kind: str, count: TokenCounter = estimate_tokens) -> Parsed:
    raw_in = raw
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raw = b""                   # not plain UTF-8 JSON: re-encoded before it goes upstream
        try:
            body = json.loads(raw_in)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise BodyError("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BodyError("the request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise BodyError("'model' is required and must be a non-empty string", "model")
    if kind == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BodyError("'messages' is required and must be a non-empty list of message objects", "messages")
        try:
            prompt = count(messages_text(messages))
        except (AttributeError, TypeError):
            raise BodyError("'messages' has malformed content parts", "messages") from None
    else:
        if "prompt" not in body:
            raise BodyError("'prompt' is required", "prompt")
        prompt = _prompt_tokens(body["prompt"], count)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BodyError("'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BodyError("'stream_options' must be an object", "stream_options")
    wants_usage = bool(options and options.get("include_usage") is True)
    max_tokens = _int_field(body, "max_completion_tokens", 1)
    legacy = _int_field(body, "max_tokens", 1)
    n = _int_field(body, "n", 1) or 1
    return Parsed(body, stream, wants_usage, prompt, max_tokens if max_tokens is not None else legacy, n, raw)


def upstream_body(parsed: Parsed) -> bytes:
    """The body sent to the backend: the client's, plus `include_usage` for streams (the gateway needs usage)."""
    body = parsed.body
    if not (parsed.stream and not parsed.wants_usage) and parsed.raw:
        return parsed.raw           # nothing to change: the client's bytes as they are
    if "stream_options" not in body and parsed.raw:
        end = parsed.raw.rstrip().rfind(b"}")
        if end > 0:                 # the one key added at the end of the client's object
            return parsed.raw[:end] + b',"stream_options":{"include_usage":true}}'
    if parsed.stream and not parsed.wants_usage:
        body = dict(body)
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    try:
        return json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:      # lone surrogates (valid JSON escapes): keep them escaped
        return json.dumps(body).encode()


def delta_tokens(chunk: dict[str, Any], kind: str, count: TokenCounter = estimate_tokens) -> int:
    """Output tokens in one streamed chunk, by `count`: at least 1 for each choice with non-empty text."""
    total = 0
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        text = ""
        if kind == COMPLETIONS:
            text = choice.get("text") if isinstance(choice.get("text"), str) else ""
        else:
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            for field in ("content", "reasoning_content", "reasoning", "refusal"):
                if isinstance(delta.get(field), str):
                    text += delta[field]
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    text += fn["arguments"]
        if text:
            total += max(1, count(text))
    return total


def usage_of(doc: Any) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from a response's `usage`, each None when absent or malformed."""
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return None, None

    def count(name: str) -> int | None:
        v = usage.get(name)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None
    return count("prompt_tokens"), count("completion_tokens")


def response_output_tokens(doc: Any, kind: str, count: TokenCounter = estimate_tokens) -> int:
    """The estimate of a non-streamed response's output, for backends that report no usage."""
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        return 0
    chunk = {"choices": [{"delta": c.get("message"), "text": c.get("text")} if isinstance(c, dict) else c
                         for c in doc["choices"]]}
    return delta_tokens(chunk, kind, count)
