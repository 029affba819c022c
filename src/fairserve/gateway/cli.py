"""`fairserve gateway`: flags and/or a TOML file → GatewayConfig → uvicorn.

Flags override the file's keys; a repeated list flag (`--backend`, `--tenant`, `--model`) replaces the file's list.
Every flag is declared on its key (`GatewayConfig`'s fields, `fairserve.api.keys`).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import socket
import ssl
import sys
from typing import Any

from ..api.keys import add_flags, flag_overrides
from ..argtypes import positive
from ..core import DEFAULT_TENANT, describe
from .settings.config import GatewayConfig, load_config


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """Raises ValueError with one line on any problem."""
    return load_config(args.config, flag_overrides(args, GatewayConfig))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    g = subparsers.add_parser(
        "gateway",
        help="serve a fair OpenAI-compatible gateway in front of OpenAI-compatible servers",
        description="A fair OpenAI-compatible gateway: requests from tenants are queued and admitted to the "
        "backends in the order of a fairness policy (VTC by default). See docs/gateway.md.",
    )
    g.add_argument("--config", metavar="FILE", help="TOML config file (flags override its keys)")
    add_flags(g, GatewayConfig, more={"policy": describe()})
    # NOTE: the access log was on by default before issue 51: the flag that turned it off is still taken
    g.add_argument("--no-access-log", dest="access_log", action="store_false", default=None, help=argparse.SUPPRESS)
    g.add_argument(
        "--engine-env",
        action="store_true",
        help="print the FAIRSERVE_* environment that gives a vLLM engine with fairserve's scheduler the same tenant "
        "tree, policy and costs (for engine_tenant=1 backends), and exit",
    )
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    g.add_argument(
        "--workers",
        type=positive(int, "a whole number"),
        default=1,
        metavar="N",
        help="N gateway processes on the one address (SO_REUSEPORT), each a replica of the shared state: needs state "
        "(--state redis://...); for more cores than one process uses (default 1)",
    )
    return g


def run(args: argparse.Namespace, sock: socket.socket | None = None, worker: int | None = None) -> int:
    """Serve until interrupted. Config problems raise ValueError with one line. `sock`: a listening socket to serve
    on, shared with the other workers of `--workers N` (`worker`: this one's index; gateway/http/workers.py)."""
    import uvicorn

    from ..api.server import check_listen_free, server_options
    from .http.app import create_app
    from .http.workers import check_workers, run_workers, serve_on

    cfg = config_from_args(args)
    if args.engine_env:
        for name, value in cfg.engine_env(cfg.policy, cfg.w_p, cfg.w_q).items():
            print(f"{name}={shlex.quote(value)}")
        return 0
    check_workers(cfg, getattr(args, "workers", 1) if worker is None else 1)
    if sock is None:
        check_listen_free(cfg.host, cfg.port)
    if cfg.state is not None:
        import asyncio

        from .shared.state import SharedStateError, probe

        try:
            asyncio.run(probe(cfg.state))
        except SharedStateError as e:  # NOTE: it cannot start: as bad input, exit 2 (README's table)
            raise ValueError(str(e)) from None
    if worker is None and getattr(args, "workers", 1) > 1:
        return run_workers(args, cfg, run)
    # NOTE: before the banner: a snapshot that cannot be restored stops it here
    app = create_app(cfg, lambda: config_from_args(args), freeze=True)
    print(
        f"fairserve gateway{'' if worker is None else f' worker {worker}'}: {_n(len(cfg.tenants), 'tenant')}, "
        f"{_n(len(cfg.backends), 'backend')}, policy {cfg.policy}, listening on {cfg.scheme}://{cfg.listen}",
        file=sys.stderr,
    )
    if cfg.keyless:
        print(
            f"fairserve gateway: WARNING: no tenants configured: keyless mode, every request is served as the one "
            f"tenant {DEFAULT_TENANT!r} with no API key checked (add [[tenants]] or --tenant NAME:KEY to share "
            "fairly between clients)",
            file=sys.stderr,
        )
    # NOTE: the gateway's own lines (request ids, cut streams, backends up and down) at the chosen level too
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    root = logging.getLogger("fairserve")
    root.addHandler(handler)
    root.setLevel(args.log_level.upper())
    tls: dict[str, Any] = {"ssl_certfile": cfg.ssl_certfile, "ssl_keyfile": cfg.ssl_keyfile} if cfg.ssl_certfile else {}
    # NOTE: unset, uvicorn's own default holds (it reads $FORWARDED_ALLOW_IPS)
    proxies: dict[str, Any] = (
        {"forwarded_allow_ips": cfg.forwarded_allow_ips} if cfg.forwarded_allow_ips is not None else {}
    )
    options: dict[str, Any] = dict(
        host=cfg.host,
        port=cfg.port,
        log_level=args.log_level,
        access_log=cfg.access_log,
        **tls,
        **proxies,
        **server_options(cfg.client_timeout_s, cfg.drain_timeout_s, cfg.max_header_bytes, cfg.max_headers),
    )
    try:
        if sock is None:
            uvicorn.run(app, **options)
        elif not serve_on(uvicorn.Server(uvicorn.Config(app, **options)), sock):
            return 3  # NOTE: as uvicorn.run: a server whose startup failed exits with its status 3
    except ssl.SSLError as e:  # NOTE: a certificate and key that do not match, a file that is not PEM
        print(f"fairserve: error: TLS: {e}", file=sys.stderr)
        return 1
    return 0


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m fairserve.gateway.cli`), until the main `fairserve` parser wires it in."""
    parser = argparse.ArgumentParser(prog="fairserve")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["gateway", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except ValueError as e:
        print(f"fairserve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
