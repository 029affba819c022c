"""Models for `fairserve serve --engine transformers`: randomly initialised Llamas built locally (no downloads) for
tests, demos and CPU benchmarks, or a local Hugging Face model directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ("<s>", "</s>", "<pad>")
# NOTE: role headers as plain text, so the byte-level tokenizer of the random models needs no extra tokens
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class RandomPreset:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    description: str


PRESETS: dict[str, RandomPreset] = {
    "tiny-random": RandomPreset(64, 2, 4, 2, 128, "2 layers, hidden 64 (~0.1M parameters): tests"),
    "small-random": RandomPreset(512, 8, 8, 4, 1408, "8 layers, hidden 512 (~25M parameters): CPU benchmarks"),
}


class ModelError(ValueError):
    """The model argument names neither a preset nor a usable local model directory."""


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (256 byte tokens + <s>, </s>, <pad>) with a simple chat template."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for tok in SPECIALS:
        vocab[tok] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def random_llama(preset: RandomPreset, vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=preset.hidden,
        intermediate_size=preset.intermediate,
        num_hidden_layers=preset.layers,
        num_attention_heads=preset.heads,
        num_key_value_heads=preset.kv_heads,
        max_position_embeddings=8192,
        bos_token_id=vocab_size - 3,
        eos_token_id=vocab_size - 2,
        pad_token_id=vocab_size - 1,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def load_model(spec: str, seed: int = 0, dtype: str = "auto"):  # noqa: ANN201 (model, tokenizer)
    """`spec`: a preset name (see PRESETS) or a local model directory. Never downloads."""
    if spec in PRESETS:
        byte_level = byte_tokenizer()
        return random_llama(PRESETS[spec], len(byte_level), seed), byte_level
    path = Path(spec).expanduser()
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelError(
            f"--model {spec!r}: not a preset ({', '.join(PRESETS)}) nor a local model directory with a "
            "config.json (fairserve never downloads models)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as e:
        raise ModelError(f"--model {spec!r}: cannot load it ({e})") from None
    return model.eval(), tokenizer
