"""/tokenize and /detokenize in vLLM's shapes, with the emulator's own reversible token ids.

The emulator counts a text as `estimate_tokens` does (one token per four characters); a token's id is the UTF-8 bytes
of its four characters read as one big-endian integer, so `detokenize(tokenize(text)) == text` for any text without
NUL characters.
"""

from __future__ import annotations

from typing import Any

from .protocol import BadRequest, is_token_id, messages_field
from .tokens import CHARS_PER_TOKEN, messages_text


def token_ids(text: str) -> list[int]:
    pieces = (text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN))
    return [int.from_bytes(p.encode(), "big") for p in pieces]


def text_of(ids: list[int]) -> str:
    return b"".join(i.to_bytes((i.bit_length() + 7) // 8, "big") for i in ids).decode(errors="replace")


def tokenize_text(body: Any) -> str:
    """The text a /tokenize body asks about: its `prompt`, or its chat `messages`. Raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    if isinstance(body.get("prompt"), str):
        return body["prompt"]
    if "messages" in body:
        return messages_text(messages_field(body))
    raise BadRequest("Missing required parameter: 'prompt' (a string) or 'messages'.", "prompt")


def detokenize_ids(body: Any) -> list[int]:
    """The token ids of a /detokenize body. Raises BadRequest."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(is_token_id(t) and t >= 0 for t in tokens):
        raise BadRequest("'tokens' must be a list of non-negative integer token ids.", "tokens")
    return tokens
