"""Model and GPU specifications for the roofline latency presets (`fairserve.sim.latency.RooflineLatency`).

Every number below names its source; docs/latency.md has the same table with notes. All weights and KV entries are
fp16/bf16 (2 bytes). "approx." marks a figure with no official datasheet behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

FP16_BYTES = 2
GiB = 1024**3


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as far as serving cost goes.

    kv_bytes_per_token = 2 (K and V) * layers * kv_heads * head_dim * bytes_per_element (see `kv_bytes`).
    weight_bytes = params * bytes_per_element.
    """

    name: str
    params: float  # parameter count (includes embeddings)
    layers: int
    hidden: int
    kv_bytes_per_token: int
    weight_bytes: float

    def __post_init__(self) -> None:
        if min(self.params, self.layers, self.hidden, self.kv_bytes_per_token, self.weight_bytes) <= 0:
            raise ValueError(f"ModelSpec {self.name!r}: all sizes must be positive")


@dataclass(frozen=True)
class GpuSpec:
    """peak_flops: dense (no sparsity) fp16/bf16 tensor-core FLOP/s; mem_bandwidth: bytes/s; memory_bytes: capacity."""

    name: str
    peak_flops: float
    mem_bandwidth: float
    memory_bytes: float

    def __post_init__(self) -> None:
        if min(self.peak_flops, self.mem_bandwidth, self.memory_bytes) <= 0:
            raise ValueError(f"GpuSpec {self.name!r}: all figures must be positive")


def kv_bytes(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int = FP16_BYTES) -> int:
    """KV-cache bytes per token: one K and one V vector per layer per KV head."""
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def _model(name: str, params: float, layers: int, hidden: int, kv_heads: int, head_dim: int) -> ModelSpec:
    return ModelSpec(name, params, layers, hidden, kv_bytes(layers, kv_heads, head_dim), params * FP16_BYTES)


# Sources: the model cards / config.json of meta-llama/Llama-2-7b-hf, Llama-2-13b-hf, Meta-Llama-3-8B
# (num_hidden_layers, hidden_size, num_key_value_heads, head_dim = hidden_size / num_attention_heads) and the
# parameter counts reported for them (Llama 2 paper, Touvron et al. 2023: 6.74e9 and 13.0e9 incl. embeddings;
# Llama 3 8B: 8.03e9, of which ~1.05e9 is the 128,256 x 4,096 embedding and output matrices).
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _model("llama-2-7b", 6.74e9, layers=32, hidden=4096, kv_heads=32, head_dim=128),  # MHA: 512 KiB/token
        _model("llama-2-13b", 13.0e9, layers=40, hidden=5120, kv_heads=40, head_dim=128),  # MHA: 800 KiB/token
        _model("llama-3-8b", 8.03e9, layers=32, hidden=4096, kv_heads=8, head_dim=128),  # GQA 8 KV heads: 128 KiB
    )
}

# Sources: NVIDIA datasheets (dense = without 2:4 sparsity; memory sizes are binary GiB, as nvidia-smi reports them).
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # A10G (AWS G5): 24 GB GDDR6, 600 GB/s, same as the NVIDIA A10 datasheet. NVIDIA publishes no A10G
        # datasheet; its dense FP16 tensor peak is approx.: we use the A10 datasheet's 125 TFLOP/s (third-party
        # listings for the A10G range from ~63 to 140). The profile's prefill runs at ~63 TFLOP/s achieved, i.e.
        # MFU ~0.5 against 125 (it would be an implausible ~0.9 against 70).
        GpuSpec("a10g", peak_flops=125e12, mem_bandwidth=600e9, memory_bytes=24 * GiB),
        # A100 80GB SXM datasheet: 312 TFLOP/s dense FP16/BF16 tensor, 2,039 GB/s HBM2e, 80 GB.
        GpuSpec("a100-80gb", peak_flops=312e12, mem_bandwidth=2039e9, memory_bytes=80 * GiB),
        # H100 SXM5 datasheet: 989 TFLOP/s dense BF16/FP16 tensor (1,979 with sparsity), 3.35 TB/s HBM3, 80 GB.
        GpuSpec("h100", peak_flops=989e12, mem_bandwidth=3.35e12, memory_bytes=80 * GiB),
    )
}
