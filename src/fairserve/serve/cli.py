"""`fairserve serve`: flags and/or a TOML file → ServeConfig → the engine → uvicorn."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..api.keys import add_flags, flag_overrides
from ..core import DEFAULT_TENANT, describe
from .config import ServeConfig, load_config


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-compatible API from a real engine scheduled by VTC",
        description="An OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /metrics, "
        "/admin) backed by Hugging Face transformers' continuous batching, whose scheduler is fairserve's "
        "policy (VTC by default). Tenants, keys and weights as in `fairserve gateway`. See docs/engines.md.",
    )
    p.add_argument("--config", metavar="FILE", help="TOML config file (flags override its keys)")
    add_flags(p, ServeConfig, more={"policy": describe(engine=True) + "; or fifo for transformers' own scheduler"})
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """Raises ValueError with one line on any problem."""
    return load_config(args.config, flag_overrides(args, ServeConfig))


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
