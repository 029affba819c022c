"""Profiling vLLM in-process (`fairserve profile --engine vllm --model PATH`): an `LLM` built in this process with
its engine core here (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) and async scheduling off, so that one
`LLMEngine.step()` is one engine step with its outputs (scheduling, the forward and output handling, as the
simulator's step). A row's requests are added together; the first step prefills them all (the grid keeps a batch
within the prefill budget), each later step decodes them all. Prompts are random tokens, new for every repeat, and
prefix caching is off unless asked for, so no prefill is served from a cache."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any

from ..sim.engine_profile import EngineProfile
from .grid import Shape, grid, row


def build(model: str, engine_args: dict[str, Any]) -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    args: dict[str, Any] = {"enable_prefix_caching": False, "async_scheduling": False, "seed": 0} | engine_args
    return LLM(model, **args)


def limits(llm: Any) -> dict[str, Any]:
    cfg = llm.llm_engine.vllm_config
    sched, cache = cfg.scheduler_config, cfg.cache_config
    return {
        "kv_tokens": int(cache.num_gpu_blocks) * int(cache.block_size),
        "block_tokens": int(cache.block_size),
        "max_num_seqs": int(sched.max_num_seqs),
        "max_batched_tokens": int(sched.max_num_batched_tokens),
        "max_model_len": int(cfg.model_config.max_model_len),
        "chunked_prefill": bool(getattr(sched, "enable_chunked_prefill", False)),
    }


def measure(llm: Any, shape: Shape, seed: int) -> tuple[float, list[float]]:
    """One repeat of a row: the prefill step's seconds and each decode step's."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    vocab = int(engine.vllm_config.model_config.get_vocab_size())
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=shape.output, ignore_eos=True, temperature=0.0)
    for i in range(shape.batch):
        ids = [rng.randrange(vocab) for _ in range(shape.prompt)]
        engine.add_request(f"profile-{seed}-{i}", {"prompt_token_ids": ids}, params)
    t0 = time.perf_counter()
    outs = engine.step()
    prefill = time.perf_counter() - t0
    if len([o for o in outs if o.outputs and o.outputs[0].token_ids]) != shape.batch:
        raise RuntimeError(f"the engine did not prefill {shape.batch} requests of {shape.prompt} tokens in one step")
    steps = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        outs = engine.step()
        elapsed = time.perf_counter() - t0
        if not any(o.finished for o in outs):  # NOTE: the last step ends the requests: its handling differs
            steps.append(elapsed)
    return prefill, steps


def profile(
    model: str,
    engine_args: dict[str, Any],
    repeats: int,
    log: Callable[[str], None] = print,
    sizes: dict[str, Any] | None = None,
    llm: Any = None,
) -> EngineProfile:
    """`sizes`: `grid.grid`'s prompts, batches and output (default: its own). `llm`: the engine already built from
    `model` and `engine_args` (one about to serve, its scheduler included), with nothing else running on it; None:
    built here."""
    if llm is None:
        llm = build(model, engine_args)
    lim = limits(llm)
    import vllm

    measure(llm, Shape(32, 2, 4), seed=10**6)  # warm-up
    rows = []
    shapes = grid(lim["max_num_seqs"], lim["max_batched_tokens"], lim["max_model_len"], **(sizes or {}))
    if not shapes:
        raise ValueError("no row of the grid fits the engine's limits (max_num_seqs, max_num_batched_tokens)")
    for k, shape in enumerate(shapes):
        prefills, steps = [], []
        for r in range(repeats):
            pre, dec = measure(llm, shape, seed=1000 * k + r)
            prefills.append(pre)
            steps += dec
        rows.append(row(shape, prefills, steps))
        log(
            f"prompt {shape.prompt:>5} batch {shape.batch:>3}: prefill {rows[-1].prefill_s * 1e3:8.2f} ms, "
            f"decode step {rows[-1].decode_step_s * 1e3:7.2f} ms"
        )
    engine = {
        "kind": "vllm",
        "model": model,
        "version": vllm.__version__,
        "settings": engine_args | {"chunked_prefill": lim["chunked_prefill"], "max_model_len": lim["max_model_len"]},
    }
    return EngineProfile(
        kv_tokens=lim["kv_tokens"],
        rows=tuple(rows),
        engine=engine,
        block_tokens=lim["block_tokens"],
        max_num_seqs=lim["max_num_seqs"],
        max_batched_tokens=lim["max_batched_tokens"],
    )
