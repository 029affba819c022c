"""A documented token estimate, used where no tokenizer is configured, and the configured tokenizers (`token_counter`).

OpenAI's rule of thumb: one token is about four characters of English text. fairserve counts
`ceil(len(text) / 4)` tokens (at least 1 for a non-empty text). The emulator writes four characters per output
token and the load generator builds prompts of 4·N characters, so the three agree exactly on synthetic traffic;
against a real model the gateway corrects its estimate from the backend's `usage`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

CHARS_PER_TOKEN = 4
OUTPUT_PIECE = " tok"  # what the emulator emits per output token (4 characters)


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


# NOTE: a chat template wraps each message in its role's markers (OpenAI counts 3 tokens a message, then 3 that
# prime the reply; a ChatML or Llama template takes 4-5)
MESSAGE_TOKENS = 4
# NOTE: OpenAI's documented cost of one 1024x1024 image at high detail (85 + 4 tiles of 170); engines differ (LLaVA
# 576, Qwen2-VL by size), and the backend's usage corrects the estimate when the request ends
IMAGE_TOKENS = 765
MEDIA_PARTS = ("image_url", "input_image", "input_audio", "audio_url", "video_url")
CHAT_EXTRAS = ("tools", "functions", "response_format")  # fields a chat template renders into the prompt


def chat_text(body: dict) -> str:
    """All the text a chat request puts in the prompt: its messages' contents, the tool calls they carry, and
    the `tools` (legacy `functions`) and `response_format` the template renders, as their JSON."""
    messages = body.get("messages") or []
    text = [messages_text(messages)]
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if isinstance(calls, list) and calls:
            text.append(_json(calls))
    text += [_json(body[k]) for k in CHAT_EXTRAS if body.get(k)]
    return "\n".join(t for t in text if t)


def media_parts(messages: list) -> int:
    """The images and audio clips in a chat request's messages (each counted as `IMAGE_TOKENS`)."""
    return sum(
        1
        for m in messages
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and p.get("type") in MEDIA_PARTS
    )


def _json(value: object) -> str:
    # NOTE: spaced as chat templates write it (jinja's `tojson` is json.dumps): a compact count would fall short
    return json.dumps(value, ensure_ascii=False, default=str)


TokenCounter = Callable[[str], int]

TIKTOKEN_BLOB = "https://openaipublic.blob.core.windows.net/encodings/"
# The tiktoken encodings fairserve can count with, as tiktoken 0.14.0 defines them in tiktoken_ext/openai_public.py:
# name -> (regex that splits text before BPE, the BPE ranks file tiktoken would fetch, that file's sha256). The
# pattern strings live inside tiktoken's constructor functions, which download the ranks file when called, so they
# are copied here (tests/test_gateway_tokenizer.py checks them against the installed tiktoken). Special tokens are
# left out: a prompt is counted with `encode_ordinary`, which reads "<|endoftext|>" in user text as plain text.
_R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = (  # tiktoken joins these parts with "|"
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"""
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"""
    r"""\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_R50K = (_R50K_PAT, "r50k_base.tiktoken", "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930")
_P50K = (_R50K_PAT, "p50k_base.tiktoken", "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069")
_CL100K = (_CL100K_PAT, "cl100k_base.tiktoken", "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7")
_O200K = (_O200K_PAT, "o200k_base.tiktoken", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d")
TIKTOKEN_ENCODINGS: dict[str, tuple[str, str, str]] = {
    "r50k_base": _R50K,
    "p50k_base": _P50K,
    "p50k_edit": _P50K,  # p50k_edit differs only in special tokens
    "cl100k_base": _CL100K,
    "o200k_base": _O200K,
    "o200k_harmony": _O200K,
}
TIKTOKEN_HELP = f'use "tiktoken:ENCODING@PATH" with a local copy of the ranks file ({TIKTOKEN_BLOB}ENCODING.tiktoken)'


def tiktoken_cached_file(encoding: str) -> Path | None:
    """Where tiktoken's own cache keeps `encoding`'s ranks file (the rules of `tiktoken.load.read_file_cached`:
    $TIKTOKEN_CACHE_DIR, else $DATA_GYM_CACHE_DIR, else TMPDIR/data-gym-cache; an empty value turns the cache off;
    the file is named by the sha1 of its URL). None when caching is off."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache_dir = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if not cache_dir:
        return None
    url = TIKTOKEN_BLOB + TIKTOKEN_ENCODINGS[encoding][1]
    return Path(cache_dir) / hashlib.sha1(url.encode()).hexdigest()


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse a `.tiktoken` BPE ranks file (lines of `base64(token) rank`) from local disk. Read here rather than with
    `tiktoken.load.load_tiktoken_bpe`, which goes through tiktoken's download cache (and may answer from a stale
    cached copy of the same path)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read tiktoken file {path}: {e.strerror or e}") from None
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise ValueError(f"{path}:{n}: not a tiktoken ranks file (expected lines of 'BASE64 RANK')") from None
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"{path}: not a tiktoken ranks file: {len(missing)} of the 256 single bytes have no rank")
    if len(set(ranks.values())) != len(ranks):
        raise ValueError(f"{path}: not a tiktoken ranks file: two tokens share a rank")
    return ranks


def tiktoken_counter(spec: str) -> TokenCounter:
    """ "ENCODING@PATH": `encoding`'s split pattern with the ranks in the local file PATH. "ENCODING": the ranks file in
    tiktoken's cache, if it is there. Nothing is ever downloaded."""
    name, at, file = spec.partition("@")
    if name not in TIKTOKEN_ENCODINGS:
        raise ValueError(f"unknown tiktoken encoding {name!r}: one of {', '.join(TIKTOKEN_ENCODINGS)}")
    try:
        import tiktoken
    except ImportError:
        raise ValueError(
            "tokenizer 'tiktoken:…' needs the `tiktoken` package: pip install 'fairserve[tiktoken]'"
        ) from None
    pat_str, _, sha256 = TIKTOKEN_ENCODINGS[name]
    if at:
        path = Path(file).expanduser()
        if not path.is_file():
            raise ValueError(f"tiktoken file not found: {path}")
        # any ranks file may be used with a known split pattern, but not another encoding's published file
        other = {h: f for _, f, h in TIKTOKEN_ENCODINGS.values()}.get(_sha256(path) or "")
        if other and other != TIKTOKEN_ENCODINGS[name][1]:
            raise ValueError(f"{path} is tiktoken's {other} file, not {name}'s")
    else:
        cached = tiktoken_cached_file(name)
        if cached is None or not cached.is_file():
            where = f"not in tiktoken's cache ({cached})" if cached else "tiktoken's cache is off (empty cache dir)"
            raise ValueError(f"tiktoken encoding {name!r} is {where} and fairserve never downloads it: {TIKTOKEN_HELP}")
        if _sha256(cached) != sha256:
            raise ValueError(f"tiktoken's cached {name} file {cached} is corrupt (sha256 mismatch): {TIKTOKEN_HELP}")
        path = cached
    ranks = read_tiktoken_ranks(path)
    enc = tiktoken.Encoding(name, pat_str=pat_str, mergeable_ranks=ranks, special_tokens={})  # ranks checked above
    return lambda text: len(enc.encode_ordinary(text)) if text else 0


def token_counter(spec: str) -> TokenCounter:
    """ "" or "estimate": `estimate_tokens`. "hf:PATH": a Hugging Face `tokenizer.json` on local disk, read with the
    `tokenizers` package (optional extra `fairserve[tokenizers]`). "tiktoken:ENCODING@PATH": an OpenAI tiktoken
    encoding (cl100k_base, o200k_base, p50k_base, r50k_base, ...) with its `.tiktoken` ranks file on local disk;
    "tiktoken:ENCODING": the same, the file taken from tiktoken's cache (optional extra `fairserve[tiktoken]`).
    Nothing is downloaded."""
    if spec in ("", "estimate"):
        return estimate_tokens
    if spec.startswith("tiktoken:"):
        return tiktoken_counter(spec[len("tiktoken:") :])
    if spec.startswith("hf:"):
        path = Path(spec[3:])
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ValueError(
                "tokenizer 'hf:…' needs the `tokenizers` package: pip install 'fairserve[tokenizers]'"
            ) from None
        if not path.is_file():
            raise ValueError(f"tokenizer file not found: {path}")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the library raises its own exception types for a bad file
            raise ValueError(f"cannot read tokenizer {path}: {e}") from None
        return lambda text: len(tok.encode(text, add_special_tokens=False).ids) if text else 0
    raise ValueError(
        f'unknown tokenizer {spec!r}: use "estimate", "hf:PATH/tokenizer.json" or "tiktoken:ENCODING@PATH.tiktoken"'
    )
