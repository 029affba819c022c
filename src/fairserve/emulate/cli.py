"""`fairserve emulate` subcommand: `add_parser(subparsers)` registers it, `run(args)` serves."""

from __future__ import annotations

import argparse

from ..api.config import split_listen
from ..core import describe
from ..sim.latency import DEFAULT_LATENCY_PROFILE, default_kv_tokens
from .config import ENGINE_MODES, EmulatorConfig

LISTEN = "127.0.0.1:8001"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "emulate",
        help="serve an OpenAI-compatible API backed by the simulated engine, in real time",
        description="An OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/embeddings, "
        "/v1/responses, /v1/models, /tokenize, /detokenize, /metrics) "
        "that is the simulated continuous-batching engine running in (scaled) real time. It always "
        "generates max_tokens tokens. Fault injection makes it a test bed for gateways.",
    )
    p.add_argument("--listen", metavar="HOST:PORT", default=LISTEN, help=f"address to serve on (default {LISTEN})")
    p.add_argument("--host", help="the HOST of --listen alone (kept for older scripts)")
    p.add_argument("--port", type=int, help="the PORT of --listen alone (kept for older scripts)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="simulated seconds per wall second (10 = ten times faster than the profiled GPU)",
    )
    p.add_argument(
        "--profile",
        default=DEFAULT_LATENCY_PROFILE,
        metavar="NAME|FILE",
        help="latency profile: a10g-llama2-7b, constant, MODEL@GPU (see `fairserve simulate`), or a profile file "
        "of a measured engine (fairserve profile)",
    )
    p.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        metavar="N",
        help="KV-cache pool in tokens (default: the profile's, 10000 for a10g-llama2-7b)",
    )
    p.add_argument("--engine-mode", default="reserve", metavar="MODE", help=f"one of: {', '.join(ENGINE_MODES)}")
    p.add_argument(
        "--policy",
        default="fcfs",
        metavar="P",
        help=f"the engine's own scheduler, default fcfs (fairness is the gateway's job): {describe()}; with the "
        "simulator's engine options (vtc:preempt=DELTA, :running-cap=TOKENS)",
    )
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="ID",
        help="a model id to serve (repeatable; the first is the default); requests for other models get 404. "
        "Without it any model name is accepted and /v1/models lists fairserve-emulated",
    )
    p.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="NAME",
        help="a LoRA adapter served on the first --model (repeatable; /v1/models lists it with that `parent`)",
    )
    p.add_argument("--error-rate", type=float, default=0.0, metavar="P", help="fraction answered 500 at once")
    p.add_argument(
        "--extra-latency",
        type=float,
        default=0.0,
        metavar="S",
        help="wall seconds every request waits before it reaches the engine",
    )
    p.add_argument(
        "--drop-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="fraction whose connection is closed after half their tokens",
    )
    p.add_argument(
        "--hang-rate", type=float, default=0.0, metavar="P", help="fraction never answered until the client disconnects"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the fault draw")
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="paged engine: share the KV blocks of prompts with a common prefix (blocks hashed from the text or token "
        "ids received), as vLLM's automatic prefix caching; /metrics reports vllm:prefix_cache_queries and _hits",
    )
    p.add_argument(
        "--block-tokens", type=int, default=16, metavar="N", help="tokens per KV block of the prefix cache (16)"
    )
    return p


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    """Raises ValueError with a clear message on a bad value."""
    kv_tokens = args.kv_tokens if args.kv_tokens is not None else default_kv_tokens(args.profile)
    return EmulatorConfig(
        models=tuple(args.model),
        loras=tuple(args.lora),
        time_scale=args.time_scale,
        profile=args.profile,
        kv_tokens=kv_tokens,
        engine_mode=args.engine_mode,
        policy=args.policy,
        error_rate=args.error_rate,
        extra_latency_s=args.extra_latency,
        drop_rate=args.drop_rate,
        hang_rate=args.hang_rate,
        seed=args.seed,
        prefix_cache=args.prefix_cache,
        block_tokens=args.block_tokens,
    )


def address(args: argparse.Namespace) -> tuple[str, int]:
    """(host, port) from --listen, with --host / --port overriding its parts. Raises ValueError."""
    try:
        host, port = split_listen(args.listen)
    except ValueError as e:
        raise ValueError(f"--listen {e}") from None
    host, port = args.host or host, port if args.port is None else args.port
    if not 0 <= port <= 65535:
        raise ValueError(f"the port must be between 0 and 65535, got {port}")
    return host, port


def run(args: argparse.Namespace) -> int:
    host, port = address(args)
    config = config_from_args(args)
    import uvicorn

    from ..api.server import check_listen_free
    from .app import create_app

    check_listen_free(host, port)
    uvicorn.run(create_app(config), host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
    return 0
