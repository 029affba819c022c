"""A prompt's prefix as what a server receives: one digest per full block of the prompt, each chaining every block up
to it, so two prompts share the digests of the blocks they share from their start (the shape of vLLM's block
hashes, over text where no tokenizer runs).

A block is `block_tokens` tokens: of a prompt given as token ids, those ids; of text, `block_tokens` x
`CHARS_PER_TOKEN` characters (the estimate `api.tokens.estimate_tokens` counts), at fixed offsets from the start, so
a shared text prefix gives the same leading blocks whatever follows it. The blocks are as many as the prompt's token
count holds whole, and no more than the text has.

`prefix_segments` gives them as the simulator's `Arrival.prefix` segments (id, tokens): the emulator's engine keys its
prefix cache by them, exactly as the simulator does a workload's (sim/prefix_cache.py `prompt_keys`). The other way,
`prompt_text` writes a workload's arrival as text that shares exactly its declared prefix with the other arrivals
(what `fairserve bench` sends), so a server's prefix cache sees the prefixes the workload declares.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Hashable, Sequence

from .tokens import CHARS_PER_TOKEN


def block_digests(prompt: str | Sequence[int], prompt_tokens: int, block_tokens: int) -> list[str]:
    """The chained digest of each full block of `prompt` (text, or token ids), in hex."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    n = prompt_tokens // block_tokens
    if isinstance(prompt, str):
        width = block_tokens * CHARS_PER_TOKEN
        n = min(n, len(prompt) // width)
        blocks = [prompt[i * width : (i + 1) * width].encode("utf-8", "surrogatepass") for i in range(n)]
    else:
        n = min(n, len(prompt) // block_tokens)
        ids = list(prompt)
        blocks = [repr(ids[i * block_tokens : (i + 1) * block_tokens]).encode() for i in range(n)]
    out, last = [], b""
    for block in blocks:
        h = hashlib.blake2b(last + block, digest_size=16)
        last = h.digest()
        out.append(h.hexdigest())
    return out


Segments = tuple[tuple[str, int], ...]


def prefix_segments(prompt: str | Sequence[int], prompt_tokens: int, block_tokens: int) -> Segments:
    """`block_digests` as prefix segments of `block_tokens` tokens each."""
    return tuple((d, block_tokens) for d in block_digests(prompt, prompt_tokens, block_tokens))


def prompt_text(prompt_tokens: int, prefix: Sequence[tuple[Hashable, int]] = (), own: Hashable = "") -> str:
    """A prompt of `prompt_tokens` estimated tokens whose text is, segment by segment, fixed by `prefix`'s ids (a
    workload's `Arrival.prefix`: each id names the whole prefix up to its segment's end), then by `own` for the rest:
    two prompts share their text exactly as far as their declared prefixes agree."""
    parts, used = [], 0
    for name, tokens in prefix:
        tokens = min(tokens, prompt_tokens - used)
        if tokens <= 0:
            break
        parts.append(_text(("segment", name), tokens))
        used += tokens
    if used < prompt_tokens:
        parts.append(_text(("own", own), prompt_tokens - used))
    return "".join(parts)


def _text(seed: Hashable, tokens: int) -> str:
    """`tokens` x `CHARS_PER_TOKEN` characters of words drawn from `seed` (the same seed, the same text)."""
    digest = hashlib.blake2b(repr(seed).encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "big"))
    chars = tokens * CHARS_PER_TOKEN
    words = []
    size = 0
    while size < chars:
        w = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=3)) + " "
        words.append(w)
        size += len(w)
    return "".join(words)[:chars]
