"""Build (once) the small random Llama that vLLM's CPU build can load, for the real-vLLM tests and benchmark.

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


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else default_dir()))
