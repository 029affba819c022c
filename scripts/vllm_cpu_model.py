"""Build (once) the small random Llama that vLLM's CPU build can load, for the real-vLLM tests and benchmark; and
random LoRA adapters for it (`lora_adapter`).

    python scripts/vllm_cpu_model.py [DIR]      # default: $FAIRSERVE_VLLM_MODEL or ~/.cache/fairserve/vllm-cpu-model

Head size 64 (hidden 256, 4 heads, 2 KV heads, 2 layers): vLLM's CPU attention supports head sizes 32, 64, 80, 96,
112, 128, 160, 192, 224, 256 and 512, so the `tiny-random` preset (head size 16) does not load. Saved with
`save_pretrained` beside fairserve's byte-level tokenizer (engines/hf_models.py); nothing is downloaded.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fairserve.engines.hf_models import RandomPreset, byte_tokenizer, random_llama

PRESET = RandomPreset(
    hidden=256,
    layers=2,
    heads=4,
    kv_heads=2,
    intermediate=512,
    description="2 layers, hidden 256, head size 64 (~1M parameters): vLLM CPU tests",
)
VERSION = "1"  # bump when PRESET or the tokenizer changes: a cached model of another version is rebuilt


def default_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("FAIRSERVE_VLLM_MODEL") or cache / "fairserve" / "vllm-cpu-model")


def build(path: Path) -> Path:
    """The model directory at `path`, built unless a complete one of this VERSION is there."""
    stamp = path / "fairserve-model-version"
    if stamp.is_file() and stamp.read_text().strip() == VERSION:
        return path
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = byte_tokenizer()
    model = random_llama(PRESET, len(tokenizer), seed=0)
    model.generation_config.do_sample = False
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    stamp.write_text(VERSION + "\n")  # last: an interrupted build is redone
    return path


def lora_adapter(path: Path, seed: int, rank: int = 8) -> Path:
    """A random rank-`rank` LoRA adapter of the model's attention projections (q, k, v, o) at `path`, in PEFT's
    layout (`adapter_model.safetensors` + `adapter_config.json`), which vLLM loads with `enable_lora=True`.
    Written with torch and safetensors (vLLM's dependencies); peft is not needed."""
    import json

    import torch
    from safetensors.torch import save_file

    head = PRESET.hidden // PRESET.heads
    out = {"q_proj": PRESET.hidden, "k_proj": PRESET.kv_heads * head, "v_proj": PRESET.kv_heads * head}
    out["o_proj"] = PRESET.hidden
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(PRESET.layers):
        for module, features in out.items():
            name = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, PRESET.hidden, generator=gen) * 0.5
            tensors[f"{name}.lora_B.weight"] = torch.randn(features, rank, generator=gen) * 0.5
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {"r": rank, "lora_alpha": 2 * rank, "target_modules": list(out), "bias": "none", "peft_type": "LORA"}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else default_dir()))
