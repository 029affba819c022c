"""`fairserve gateway`: flags and/or a TOML file → GatewayConfig → uvicorn.

Flags override the file's keys; a repeated list flag (`--backend`, `--tenant`, `--model`) replaces the file's list.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import ssl
import sys
from typing import Any

from ..core import describe
from ..tenancy import add_server_arguments, flag_overrides, tree_overrides
from .config import GatewayConfig, load_config

BACKEND_OPTIONS = {
    "max_requests": "max_inflight_requests",
    "max_tokens": "max_inflight_tokens",
    "api_key": "api_key",
    "adaptive": "adaptive",
    "metrics_url": "metrics_url",
    "engine_tenant": "engine_tenant",
    "models": "models",
}
FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def parse_backend(text: str) -> dict[str, Any]:
    """`URL[,max_requests=N][,max_tokens=M][,api_key=K][,adaptive=1][,metrics_url=U][,engine_tenant=1]
    [,models=A|B]` → a backend table."""
    url, *options = (p.strip() for p in text.split(","))
    out: dict[str, Any] = {"url": url}
    for opt in options:
        name, sep, value = (x.strip() for x in opt.partition("="))
        if not sep or name not in BACKEND_OPTIONS:
            raise ValueError(
                f"bad --backend option {opt!r} in {text!r}: expected one of "
                f"{', '.join(k + '=...' for k in BACKEND_OPTIONS)}"
            )
        if name == "models":  # NOTE: `|` between ids: a comma separates the options
            out[name] = [m.strip() for m in value.split("|") if m.strip()]
            continue
        if name in ("api_key", "metrics_url"):
            out[name] = value
            continue
        if name in ("adaptive", "engine_tenant"):
            if value.lower() not in FLAGS:
                raise ValueError(f"bad --backend option {opt!r}: expected {name}=1 or {name}=0")
            out[name] = FLAGS[value.lower()]
            continue
        try:
            out[BACKEND_OPTIONS[name]] = int(value)
        except ValueError:
            raise ValueError(f"bad --backend option {opt!r}: {value!r} is not a whole number") from None
    return out


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """Raises ValueError with one line on any problem."""
    overrides = flag_overrides(args, GatewayConfig)
    if args.backend:
        overrides["backends"] = [parse_backend(b) for b in args.backend]
    overrides.update(tree_overrides(args))
    if args.model:
        overrides["models"] = list(args.model)
    return load_config(args.config, overrides)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    g = subparsers.add_parser(
        "gateway",
        help="serve a fair OpenAI-compatible gateway in front of OpenAI-compatible servers",
        description="A fair OpenAI-compatible gateway: requests from tenants are queued and admitted to the "
        "backends in the order of a fairness policy (VTC by default). See docs/gateway.md.",
    )
    g.add_argument("--config", metavar="FILE", help="TOML config file (flags override its keys)")
    g.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (default 127.0.0.1:8080)")
    g.add_argument(
        "--backend",
        action="append",
        metavar="URL[,max_requests=N,max_tokens=M,api_key=K,adaptive=1,metrics_url=U,engine_tenant=1,models=A|B]",
        help="an OpenAI-compatible server; repeat for several. models=A|B: the model ids it serves (default: those "
        "it lists at /v1/models). engine_tenant=1: name the tenant to the "
        "engine (vllm_xargs.fairserve_client, for vLLM with fairserve's VTCScheduler). "
        "adaptive=1: limit its in-flight requests "
        "from its /metrics (vLLM, SGLang, llama.cpp)",
    )
    g.add_argument("--policy", metavar="P", help=f"the scheduling policy, default vtc: {describe()}")
    add_server_arguments(g)
    g.add_argument(
        "--scope",
        choices=["per_model", "global"],
        help="counters per model pool (per_model, the default) or one account per tenant over the fleet (global)",
    )
    g.add_argument("--usage-log", metavar="PATH|-", help="one JSON line per request, to this file or - (stdout)")
    g.add_argument(
        "--tokenize-concurrency", type=int, metavar="N", help="/tokenize and /detokenize in flight per tenant (4)"
    )
    g.add_argument("--queue-limit", type=int, metavar="N", help="queued requests per tenant (default 256)")
    g.add_argument(
        "--queue-ttl",
        dest="queue_ttl_s",
        type=float,
        metavar="S",
        help="longest wait in the queue, seconds (default 300)",
    )
    g.add_argument(
        "--trusted-proxy", action="store_true", default=None, help="honour X-Tenant-Id from holders of a valid key"
    )
    g.add_argument(
        "--tokenizer",
        metavar="NAME",
        help='"estimate" (default), "hf:PATH/tokenizer.json" or "tiktoken:ENCODING@PATH.tiktoken" (local files)',
    )
    g.add_argument("--default-max-tokens", type=int, metavar="N", help="assumed max_tokens when unset (512)")
    g.add_argument("--model", action="append", metavar="NAME", help="model names for /v1/models if no backend answers")
    g.add_argument(
        "--backend-cooldown",
        dest="backend_cooldown_s",
        type=float,
        metavar="S",
        help="without health checks: skip an unreachable backend this long (2)",
    )
    g.add_argument("--health-path", metavar="PATH", help="each backend's health check path (/health)")
    g.add_argument(
        "--health-interval",
        dest="health_interval_s",
        type=float,
        metavar="S",
        help="seconds between health checks; 0: none (5)",
    )
    g.add_argument(
        "--connect-timeout", dest="connect_timeout_s", type=float, metavar="S", help="connecting to a backend (5)"
    )
    g.add_argument(
        "--request-timeout",
        dest="request_timeout_s",
        type=float,
        metavar="S",
        help="a backend's first byte (a non-streamed answer: all of it), seconds (120)",
    )
    g.add_argument(
        "--chunk-timeout",
        dest="chunk_timeout_s",
        type=float,
        metavar="S",
        help="between two pieces of a backend's answer (30)",
    )
    g.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        default=None,
        help="no line per request in the log (uvicorn's access log costs ~14%% of the CPU per request)",
    )
    g.add_argument(
        "--metrics-interval",
        dest="metrics_interval_s",
        type=float,
        metavar="S",
        help="seconds between reads of adaptive backends' /metrics (1)",
    )
    g.add_argument(
        "--state",
        metavar="URL",
        help="share counters, backlog and backend capacity with other replicas "
        "through Redis: redis://[:PASSWORD@]HOST:PORT/DB (rediss:// for TLS)",
    )
    g.add_argument(
        "--state-interval",
        dest="state_interval_s",
        type=float,
        metavar="S",
        help="seconds between flushes to the shared state (0.02)",
    )
    g.add_argument(
        "--snapshot",
        metavar="FILE",
        help="without --state: keep counters, service and admin weight changes across restarts in FILE "
        "(written at shutdown and every --snapshot-interval, restored at start)",
    )
    g.add_argument(
        "--snapshot-interval",
        dest="snapshot_interval_s",
        type=float,
        metavar="S",
        help="seconds between snapshots; 0: at shutdown (60)",
    )
    g.add_argument(
        "--client-write-timeout",
        dest="client_write_timeout_s",
        type=float,
        metavar="S",
        help="cut a stream whose client accepted nothing for this long (60)",
    )
    g.add_argument(
        "--client-min-rate",
        type=int,
        metavar="BYTES",
        help="cut a stream whose client reads slower than this many bytes/s over a --client-write-timeout "
        "while data waits for it; 0: no rate (1024)",
    )
    g.add_argument(
        "--metrics-window",
        dest="metrics_window_s",
        type=float,
        metavar="S",
        help="a tenant's series stay in /metrics this long (900)",
    )
    g.add_argument(
        "--auth-failure-limit",
        type=int,
        metavar="N",
        help="after N failed authentications from one address, or with one key, within a minute, 429 for its wrong "
        "keys (a valid key is still served); 0: off (20)",
    )
    g.add_argument(
        "--forwarded-allow-ips",
        metavar="IP,CIDR,...|*",
        help="proxies whose X-Forwarded-For gives the client's address (default: $FORWARDED_ALLOW_IPS, else "
        "127.0.0.1 and ::1)",
    )
    g.add_argument("--max-header-bytes", type=int, metavar="N", help="largest request line and headers (32768)")
    g.add_argument("--max-headers", type=int, metavar="N", help="most header fields in a request (100)")
    g.add_argument("--ssl-certfile", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    g.add_argument("--ssl-keyfile", metavar="FILE", help="the certificate's private key (PEM)")
    g.add_argument(
        "--engine-env",
        action="store_true",
        help="print the FAIRSERVE_* environment that gives a vLLM engine with fairserve's scheduler the same tenant "
        "tree, policy and costs (for engine_tenant=1 backends), and exit",
    )
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return g


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted. Config problems raise ValueError with one line."""
    import uvicorn

    from ..api.server import check_listen_free, server_options
    from .app import create_app

    cfg = config_from_args(args)
    if args.engine_env:
        for name, value in cfg.engine_env(cfg.policy, cfg.w_p, cfg.w_q).items():
            print(f"{name}={shlex.quote(value)}")
        return 0
    check_listen_free(cfg.host, cfg.port)
    if cfg.state is not None:
        import asyncio

        from .shared_state import SharedStateError, probe

        try:
            asyncio.run(probe(cfg.state))
        except SharedStateError as e:  # NOTE: it cannot start: as bad input, exit 2 (README's table)
            raise ValueError(str(e)) from None
    app = create_app(
        cfg, lambda: config_from_args(args)
    )  # NOTE: before the banner: a snapshot that cannot be restored stops it here
    print(
        f"fairserve gateway: {_n(len(cfg.tenants), 'tenant')}, {_n(len(cfg.backends), 'backend')}, "
        f"policy {cfg.policy}, listening on {cfg.scheme}://{cfg.listen}",
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
    try:
        uvicorn.run(
            app,
            host=cfg.host,
            port=cfg.port,
            log_level=args.log_level,
            access_log=cfg.access_log,
            **tls,
            **proxies,
            **server_options(cfg.client_timeout_s, cfg.drain_timeout_s, cfg.max_header_bytes, cfg.max_headers),
        )
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
