"""/v1/embeddings: the request's inputs and their token count, and OpenAI's response shape.

`input` is a string, a list of strings, a list of token ids or a list of such lists; each is one embedding. The
prompt tokens of a request are the sum over its inputs (a token list counts its length). `encoding_format` is
"float" (a list of numbers) or "base64" (the little-endian float32 bytes, base64: what the official `openai` client
asks for by default and decodes).
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from dataclasses import dataclass
from typing import Any

from .protocol import MAX_INT, BadRequest, body_model, is_token_id
from .tokens import TokenCounter, estimate_tokens

ENCODINGS = ("float", "base64")
DEFAULT_DIMENSIONS = 32  # the emulator's vectors, unless the request asks for `dimensions`
MAX_DIMENSIONS = 4096


@dataclass(frozen=True)
class EmbeddingsCall:
    model: str | None
    inputs: tuple[str | tuple[int, ...], ...]  # one embedding each
    prompt_tokens: int  # over every input
    encoding_format: str
    dimensions: int | None


def parse_embeddings(body: Any, *, strict: bool, count: TokenCounter = estimate_tokens) -> EmbeddingsCall:
    """Validate an embeddings body (strict: `model` may be omitted; lenient, the gateway: it is required).
    Raises BadRequest naming the field."""
    model = body_model(body, strict)
    inputs = _inputs(body.get("input"))
    fmt = body.get("encoding_format", "float")
    if fmt not in ENCODINGS:
        raise BadRequest(f"'encoding_format' must be one of {', '.join(ENCODINGS)}.", "encoding_format")
    dims = body.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= MAX_DIMENSIONS):
        raise BadRequest(f"'dimensions' must be an integer from 1 to {MAX_DIMENSIONS}.", "dimensions")
    tokens = sum(len(i) if isinstance(i, tuple) else count(i) for i in inputs)
    return EmbeddingsCall(model, inputs, tokens, fmt, dims)


def _inputs(value: Any) -> tuple[str | tuple[int, ...], ...]:
    if value is None:
        raise BadRequest("Missing required parameter: 'input'.", "input")
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value:
        if all(is_token_id(t) for t in value):
            return (_ids(value),)
        if all(isinstance(v, str) for v in value):
            return tuple(value)
        if all(isinstance(v, list) and v and all(is_token_id(t) for t in v) for v in value):
            return tuple(_ids(v) for v in value)
    raise BadRequest(
        "'input' must be a string, a non-empty list of strings, a list of token ids or a list of such lists.", "input"
    )


def _ids(tokens: list) -> tuple[int, ...]:
    if any(not 0 <= t <= MAX_INT for t in tokens):
        raise BadRequest(f"token ids in 'input' must be integers from 0 to {MAX_INT}.", "input")
    return tuple(tokens)


def vector(item: str | tuple[int, ...], dimensions: int) -> list[float]:
    """A deterministic unit vector for an input (the same input always gets the same vector)."""
    seed = hashlib.blake2b(repr(item).encode(), digest_size=16).digest()
    raw = b"".join(
        hashlib.blake2b(seed + i.to_bytes(4, "little"), digest_size=64).digest() for i in range(dimensions // 16 + 1)
    )
    values = [v / 2**31 - 1.0 for v in struct.unpack(f"<{len(raw) // 4}I", raw)[:dimensions]]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def encode(values: list[float], fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values


def embeddings_body(model: str, call: EmbeddingsCall, dimensions: int) -> dict[str, Any]:
    data = [
        {"object": "embedding", "index": i, "embedding": encode(vector(item, dimensions), call.encoding_format)}
        for i, item in enumerate(call.inputs)
    ]
    usage = {"prompt_tokens": call.prompt_tokens, "total_tokens": call.prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}
