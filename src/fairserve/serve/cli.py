"""`fairserve serve`: flags and/or a TOML file → ServeConfig → the engine → uvicorn."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..core import DEFAULT_TENANT, describe
from ..tenancy import add_server_arguments, flag_overrides, tree_overrides
from .config import ENGINES, ServeConfig, load_config


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-compatible API from a real engine scheduled by VTC",
        description="An OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /metrics, "
        "/admin) backed by Hugging Face transformers' continuous batching, whose scheduler is fairserve's "
        "policy (VTC by default). Tenants, keys and weights as in `fairserve gateway`. See docs/engines.md.",
    )
    p.add_argument("--config", metavar="FILE", help="TOML config file (flags override its keys)")
    p.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (default 127.0.0.1:8000)")
    p.add_argument("--engine", choices=ENGINES, help="the inference engine (default transformers)")
    p.add_argument(
        "--model",
        metavar="NAME_OR_DIR",
        help="tiny-random (default) or small-random: a random Llama built locally; or a local Hugging "
        "Face model directory (never downloaded)",
    )
    p.add_argument("--served-model-name", metavar="NAME", help="the model name /v1/models lists (default: --model)")
    p.add_argument(
        "--policy",
        metavar="P",
        help=f"the engine's scheduler, default vtc: {describe(engine=True)}; or fifo for transformers' own "
        "scheduler (no accounts)",
    )
    add_server_arguments(p)  # without --tenant: no keys, one tenant "anonymous"
    p.add_argument("--default-max-tokens", type=int, metavar="N", help="max_tokens when a request sets none (256)")
    p.add_argument("--num-blocks", type=int, metavar="N", help="KV-cache blocks (default 512)")
    p.add_argument("--page-size", type=int, metavar="N", help="tokens per block (default 32; pool = blocks × size)")
    p.add_argument("--max-batch-tokens", type=int, metavar="N", help="tokens per forward pass (default 512)")
    p.add_argument("--max-requests-per-batch", type=int, metavar="N", help="requests per forward pass (default 64)")
    p.add_argument("--seed", type=int, metavar="N", help="seed of the random presets' weights (default 0)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """Raises ValueError with one line on any problem."""
    overrides = flag_overrides(args, ServeConfig)
    overrides.update(tree_overrides(args))
    return load_config(args.config, overrides)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    try:
        from .app import create_app
    except ImportError as e:
        raise ValueError(
            f"`fairserve serve --engine transformers` needs torch and transformers: "
            f"pip install 'fairserve[transformers]' ({e})"
        ) from None
    import uvicorn

    from ..api.server import check_listen_free, server_options
    from ..engines.hf_models import ModelError

    try:
        app = create_app(cfg)
    except ModelError as e:
        raise ValueError(str(e)) from None
    tenants = f"{len(cfg.tenants)} tenants" if cfg.tenants else f"no API keys (one tenant {DEFAULT_TENANT!r})"
    check_listen_free(cfg.host, cfg.port)
    print(
        f"fairserve serve: {cfg.engine} engine, model {cfg.model}, policy {cfg.policy}, {tenants}, "
        f"KV pool {cfg.num_blocks * cfg.page_size} tokens, listening on http://{cfg.listen}",
        file=sys.stderr,
    )
    uvicorn.run(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=args.log_level,
        **server_options(cfg.client_timeout_s, cfg.drain_timeout_s),
    )
    return 0
