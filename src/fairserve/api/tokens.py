"""A documented token estimate, used where no tokenizer is configured.

OpenAI's rule of thumb: one token is about four characters of English text. fairserve counts
`ceil(len(text) / 4)` tokens (at least 1 for a non-empty text). The emulator writes four characters per output
token and the load generator builds prompts of 4·N characters, so the three agree exactly on synthetic traffic;
against a real model the gateway corrects its estimate from the backend's `usage`.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

CHARS_PER_TOKEN = 4
OUTPUT_PIECE = " tok"          # what the emulator emits per output token (4 characters)


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN) if text else 0


def prompt_of(tokens: int) -> str:
    """A prompt that `estimate_tokens` counts as exactly `tokens` tokens."""
    return "lorem ip" * (tokens // 2) + "sum " * (tokens % 2)


def messages_text(messages: list) -> str:
    """The text a chat request's messages contribute to the prompt (string or list-of-parts content)."""
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p.get("text", "") for p in content if isinstance(p, dict)]
    return "\n".join(parts)


TokenCounter = Callable[[str], int]


def token_counter(spec: str) -> TokenCounter:
    """"" or "estimate": `estimate_tokens`. "hf:PATH": a Hugging Face `tokenizer.json` on local disk, read with the
    `tokenizers` package (optional extra `fairserve[tokenizers]`; nothing is downloaded)."""
    if spec in ("", "estimate"):
        return estimate_tokens
    if spec.startswith("hf:"):
        path = Path(spec[3:])
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ValueError("tokenizer 'hf:…' needs the `tokenizers` package: pip install 'fairserve[tokenizers]'") \
                from None
        if not path.is_file():
            raise ValueError(f"tokenizer file not found: {path}")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:   # the library raises its own exception types for a bad file
            raise ValueError(f"cannot read tokenizer {path}: {e}") from None
        return lambda text: len(tok.encode(text, add_special_tokens=False).ids) if text else 0
    raise ValueError(f'unknown tokenizer {spec!r}: use "estimate" or "hf:PATH/tokenizer.json"')
