"""What the gateway reads from OpenAI request and response bodies: validation, token estimates, usage."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from ...api.embeddings import parse_embeddings
from ...api.protocol import MAX_INT, BadRequest, parse_json, parse_request, priority_field
from ...api.responses import parse_responses, usage_tokens
from ...api.tokens import TokenCounter, estimate_tokens
from ...engines.queue import CLIENT_ARG
from ..admission.footprint import DEFAULT_MAX_TOKENS, Footprint

CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES = "chat", "completions", "embeddings", "responses"
PATHS = {
    CHAT: "/v1/chat/completions",
    COMPLETIONS: "/v1/completions",
    EMBEDDINGS: "/v1/embeddings",
    RESPONSES: "/v1/responses",
}


BodyError = BadRequest  # a request body the gateway refuses (400); `param` names the offending field


@dataclass(slots=True)
class Parsed:
    body: dict[str, Any]
    stream: bool
    wants_usage: bool  # the client itself asked for stream_options.include_usage
    footprint: Footprint  # the gateway's estimate of its prompt and the bound of its output
    max_tokens: int | None  # as the client set it (chat: max_completion_tokens, else max_tokens)
    raw: bytes = b""  # the body as the client sent it
    priority: int | None = None  # vLLM's `priority`, as the client named it
    model: str | None = None
    kind: str = CHAT


# the field that bounds a request's output, sent upstream when the client set none (chat's `max_tokens`: the one
# every OpenAI-compatible server reads; `max_completion_tokens` is newer)
OUTPUT_FIELD = {CHAT: "max_tokens", COMPLETIONS: "max_tokens", RESPONSES: "max_output_tokens"}


def parse_body(
    raw: bytes,
    kind: str,
    count: TokenCounter = estimate_tokens,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    aliases: Mapping[str, str] | None = None,
) -> Parsed:
    """The request, by `api`'s parsers in their lenient (proxy) mode: token-id prompts, any n and unknown
    fields pass through. Embeddings produce no output (capacity: their inputs); a responses body's stateful fields
    (`previous_response_id`, `background`) are refused. A model named in `aliases` is replaced by the model it
    stands for before anything else reads the body. Raises BodyError."""
    try:
        body, plain = orjson.loads(raw), True
    except orjson.JSONDecodeError:
        body, plain = parse_json(raw), False  # not plain UTF-8 JSON: re-encoded before it goes upstream
    kept = raw if plain else b""
    if aliases and isinstance(body, dict) and isinstance(model := body.get("model"), str) and model in aliases:
        body, kept = {**body, "model": aliases[model]}, b""  # NOTE: served as the model it names, re-encoded
    if kind == EMBEDDINGS:
        e = parse_embeddings(body, strict=False, count=count)
        return Parsed(
            body, False, False, Footprint(e.prompt_tokens, 0, 0), None, kept, priority_field(body), e.model, kind
        )
    if kind == RESPONSES:
        c = parse_responses(body, strict=False, count=count)
        out = c.max_output_tokens
        footprint = Footprint(c.prompt_tokens, out or default_max_tokens)
        return Parsed(body, c.stream, False, footprint, out, kept, priority_field(body), c.model, kind)
    r = parse_request(body, kind == CHAT, strict=False, count=count)
    footprint = Footprint(r.prompt_tokens, r.max_tokens or default_max_tokens, r.sequences)
    return Parsed(body, r.stream, r.include_usage, footprint, r.max_tokens, kept, r.priority, r.model, kind)


def served_as(parsed: Parsed, model: str) -> Parsed:
    """`parsed` for `model` instead of the one it names (a fallback): its body's `model` replaced, re-encoded."""
    return replace(parsed, body={**parsed.body, "model": model}, raw=b"", model=model)


def upstream_body(parsed: Parsed, engine_client: str | None = None, priority: int = 0) -> bytes:
    """The body sent to the backend: the client's, plus the output bound of its footprint when the client set none
    (so that the backend stops where the gateway's estimate does), plus `include_usage` for streams (the gateway
    needs usage), plus with `engine_client` the tenant named to the engine (`vllm_xargs: {"fairserve_client":
    TENANT}`) and the `priority` the request runs at (unless 0), so that the engine's own VTC counts the gateway's
    tenants at the gateway's levels. Without it a `priority` the client named is not forwarded: the gateway has
    served by it, and a vLLM without `--scheduling-policy priority` refuses any priority but 0."""
    body = parsed.body
    if engine_client is not None:
        xargs = body.get("vllm_xargs")
        body = {**body, "vllm_xargs": {**(xargs if isinstance(xargs, dict) else {}), CLIENT_ARG: engine_client}}
        if priority or "priority" in body:
            body["priority"] = priority
        parsed = replace(parsed, body=body, raw=b"")
    elif "priority" in body:
        body = {k: v for k, v in body.items() if k != "priority"}
        parsed = replace(parsed, body=body, raw=b"")
    added: dict[str, Any] = {}
    bound = OUTPUT_FIELD.get(parsed.kind)
    if bound is not None and parsed.max_tokens is None:
        added[bound] = parsed.footprint.output_tokens
    # NOTE: a responses stream ends with its usage anyway (response.completed); embeddings are never streamed
    if parsed.stream and not parsed.wants_usage and parsed.kind in (CHAT, COMPLETIONS):
        added["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    if not added and parsed.raw:
        return parsed.raw  # nothing to change: the client's bytes as they are
    if parsed.raw and not any(k in body for k in added):
        end = parsed.raw.rstrip().rfind(b"}")
        if end > 0:  # the keys added at the end of the client's object
            return parsed.raw[:end] + b"," + orjson.dumps(added)[1:]
    # NOTE: json, not orjson: a body read by json's extensions (NaN, integers past 64 bits) is written back as sent
    return json.dumps({**body, **added}, ensure_ascii=False).encode()


def delta_tokens(chunk: dict[str, Any], kind: str, count: TokenCounter = estimate_tokens) -> int:
    """Output tokens in one streamed chunk, by `count`: at least 1 for each choice with non-empty text."""
    total = 0
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        text = ""
        if kind == COMPLETIONS:
            value = choice.get("text")
            text = value if isinstance(value, str) else ""
        else:
            found = choice.get("delta")
            delta: dict[str, Any] = found if isinstance(found, dict) else {}
            for field in ("content", "reasoning_content", "reasoning", "refusal"):
                part = delta.get(field)
                if isinstance(part, str):
                    text += part
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    text += fn["arguments"]
        if text:
            total += max(1, count(text))
    return total


def usage_of(doc: Any, kind: str = CHAT) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from a response's `usage` (a Responses body's input_tokens and
    output_tokens; an embeddings body's prompt_tokens and no output), each None when absent or malformed."""
    if kind == RESPONSES:
        got = usage_tokens(doc)
        return (None, None) if got is None or max(got) > MAX_INT else got
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return None, None

    def count(name: str) -> int | None:
        v = usage.get(name)
        # NOTE: bounded like a request's counts: a backend's 10**400 would overflow the accounting
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_INT else None

    return count("prompt_tokens"), count("completion_tokens")


def response_output_tokens(doc: Any, kind: str, count: TokenCounter = estimate_tokens) -> int:
    """The estimate of a non-streamed response's output, for backends that report no usage."""
    if kind == EMBEDDINGS:
        return 0
    if kind == RESPONSES:
        return responses_output_tokens(doc, count)
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        return 0
    chunk = {
        "choices": [
            {"delta": c.get("message"), "text": c.get("text")} if isinstance(c, dict) else c for c in doc["choices"]
        ]
    }
    return delta_tokens(chunk, kind, count)


def responses_output_tokens(doc: Any, count: TokenCounter = estimate_tokens) -> int:
    """The estimate of a Responses body's output: the text of its `output` items' parts."""
    total = 0
    items = doc.get("output") if isinstance(doc, dict) else None
    for item in items if isinstance(items, list) else ():
        parts = item.get("content") if isinstance(item, dict) else None
        for part in parts if isinstance(parts, list) else ():
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str) and text:
                total += max(1, count(text))
    return total


def responses_delta_tokens(doc: dict[str, Any], count: TokenCounter = estimate_tokens) -> int:
    """Output tokens in one Responses stream event: a `response.output_text.delta`'s text (at least 1)."""
    if doc.get("type") != "response.output_text.delta":
        return 0
    delta = doc.get("delta")
    return max(1, count(delta)) if isinstance(delta, str) and delta else 0
