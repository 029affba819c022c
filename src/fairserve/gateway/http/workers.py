"""`fairserve gateway --workers N`: N gateway processes on one address, for a machine with more cores than one
Python process can use.

Each worker is a whole gateway and a replica of the shared state (`state = "redis://…"`, docs/gateway.md, "Running
several replicas"): the workers share the counters, the backlog and the backends' capacity through Redis exactly as
replicas on separate machines do, so fairness holds across them with the replicas' bound. They listen on the same
port with `SO_REUSEPORT`, so the kernel spreads connections over them (by connection: a keep-alive client stays on
one worker). The parent process only starts them, forwards SIGTERM and SIGINT (each worker drains as one gateway
does) and exits when they have; if a worker dies, it stops the others and exits 1, for a supervisor to restart.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from ..settings.config import GatewayConfig

WORKERS_MAX = 256


def check_workers(cfg: GatewayConfig, workers: int) -> None:
    """ValueError (one line) where N workers cannot serve this configuration."""
    if not 1 <= workers <= WORKERS_MAX:
        raise ValueError(f"--workers must be between 1 and {WORKERS_MAX}, got {workers}")
    if workers == 1:
        return
    if cfg.state is None:
        raise ValueError(
            "--workers N runs N replicas of one gateway: they share the ledger through Redis; give state = "
            '"redis://HOST:PORT" (--state URL)'
        )
    if not hasattr(socket, "SO_REUSEPORT"):
        raise ValueError("--workers N needs SO_REUSEPORT, which this platform does not have: run one per port")


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` that the other workers bind too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def serve_on(server: Any, sock: socket.socket) -> bool:
    """A worker's uvicorn `server` on the shared `sock` until stopped; whether it started."""
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return bool(server.started)


def _worker(args: argparse.Namespace, index: int, run: Callable[..., int], host: str, port: int) -> None:
    """One worker: `run` (the command's, `gateway/cli.py`) of `args` on a socket it shares with the others."""
    sock = reuse_port_socket(host, port)
    # NOTE: uvicorn drains on SIGTERM / SIGINT, then raises the signal again with the handler it found: a stop the
    # parent asked for is then a clean exit, not a death by signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    try:
        sys.exit(run(args, sock=sock, worker=index))
    except ValueError as e:
        print(f"fairserve: error: {e}", file=sys.stderr)
        sys.exit(2)


def run_workers(args: argparse.Namespace, cfg: GatewayConfig, run: Callable[..., int]) -> int:
    """Start `args.workers` workers, each serving `run(args, sock=…, worker=i)`, wait for them, forward the stop
    signals. The exit status: 0 when every worker stopped cleanly, else 1."""
    n = int(args.workers)
    ctx = mp.get_context("spawn")  # NOTE: a fresh interpreter each: no event loop or socket copied from this one
    procs = [
        ctx.Process(target=_worker, args=(args, i, run, cfg.host, cfg.port), name=f"fairserve-gateway-{i}")
        for i in range(n)
    ]
    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.terminate()  # NOTE: SIGTERM: each worker drains as one gateway does

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        f"fairserve gateway: {n} worker processes on {cfg.scheme}://{cfg.listen}, each a replica of the shared state",
        file=sys.stderr,
    )
    for p in procs:
        p.start()
    failed = False
    while any(p.exitcode is None for p in procs):
        for p in procs:
            p.join(0.2)
            if p.exitcode is not None and p.exitcode != 0 and not stopping:
                print(f"fairserve gateway: {p.name} exited with {p.exitcode}: stopping the others", file=sys.stderr)
                failed = True
                stop(signal.SIGTERM, None)
        time.sleep(0.05)
    return 1 if failed or any(p.exitcode for p in procs) else 0
