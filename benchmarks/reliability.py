"""The gateway under faults, measured: load held through a backend outage, a hanging backend, stalled uploads, and a
SIGTERM drain. Everything on loopback; the emulator and the gateway run as their own processes.

    python benchmarks/reliability.py [--clients 48] [--seconds 30] [--outage 5]

Prints one table (markdown): what was done, what happened, and whether anything was lost (every request sent has
exactly one outcome in /metrics, and the accounts agree with the token counters)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

KEYS = {"t1": "k1", "t2": "k2", "t3": "k3", "t4": "k4"}
ADMIN = "adm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], url: str, health: str = "/healthz") -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairserve", *args], stdout=subprocess.DEVNULL, stderr=tempfile.TemporaryFile()
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + health, timeout=1).status_code in (200, 503):
                return proc
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{args[0]} did not start")


def emulator(port: int, *flags: str) -> subprocess.Popen:
    return start(["emulate", "--listen", f"127.0.0.1:{port}", "--time-scale", "2", *flags], f"http://127.0.0.1:{port}")


def gateway(port: int, backend: int, *flags: str) -> subprocess.Popen:
    tenants = [x for name, key in KEYS.items() for x in ("--tenant", f"{name}:{key}")]
    return start(
        [
            "gateway",
            "--listen",
            f"127.0.0.1:{port}",
            "--backend",
            f"http://127.0.0.1:{backend},max_requests=16",
            *tenants,
            "--admin-key",
            ADMIN,
            "--no-access-log",
            "--log-level",
            "warning",
            "--health-interval",
            "0.5",
            *flags,
        ],
        f"http://127.0.0.1:{port}",
    )


async def stream(c: httpx.AsyncClient, base: str, key: str, tokens: int) -> str:
    """One streamed request: its outcome as the client saw it (ok, an error event's code, or the HTTP status)."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hello " * 20}],
        "max_tokens": tokens,
        "stream": True,
    }
    try:
        async with c.stream(
            "POST", base + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            if r.status_code != 200:
                await r.aread()
                return str(r.status_code)
            outcome = "truncated"
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    outcome = "ok"
                elif line.startswith('data: {"error"'):
                    outcome = json.loads(line[6:])["error"]["code"]
            return outcome
    except httpx.HTTPError as e:
        return type(e).__name__


def counted(base: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith("fairserve_gateway_requests_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            out[labels["outcome"]] = out.get(labels["outcome"], 0) + float(line.rpartition(" ")[2])
    return {k: v for k, v in out.items() if v}


def consistent(base: str) -> bool:
    text = httpx.get(base + "/metrics").text
    rows = httpx.get(base + "/admin/tenants", headers={"Authorization": f"Bearer {ADMIN}"}).json()["tenants"]

    def sample(name: str, tenant: str) -> float:
        return float(re.search(rf'^{name}{{tenant="{tenant}"}} (\S+)$', text, re.M).group(1))

    return all(
        r["queue_length"] == 0
        and r["in_flight"] == 0
        and abs(
            r["service"]
            - sample("fairserve_gateway_prompt_tokens_total", r["name"])
            - 2 * sample("fairserve_gateway_output_tokens_total", r["name"])
        )
        < 1e-6 * max(1.0, r["service"])
        for r in rows
    )


def poll(check, timeout_s: float) -> float:
    """Seconds until `check()` holds (polled every 20 ms); inf if it never did."""
    start_ = time.monotonic()
    while time.monotonic() - start_ < timeout_s:
        if check():
            return time.monotonic() - start_
        time.sleep(0.02)
    return float("inf")


def status(base: str) -> int:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(base + "/healthz", timeout=1).status_code
    return 0


async def outage(args: argparse.Namespace) -> list[str]:
    bport, gport = free_port(), free_port()
    base = f"http://127.0.0.1:{gport}"
    backend = emulator(bport)
    gw = gateway(gport, bport, "--queue-ttl", "60")
    seen: list[str] = []
    stop = time.monotonic() + args.seconds
    keys = list(KEYS.values())

    async def client(i: int) -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            while time.monotonic() < stop:
                seen.append(await stream(c, base, keys[i % len(keys)], 16 + 8 * (i % 4)))

    tasks = [asyncio.create_task(client(i)) for i in range(args.clients)]
    await asyncio.sleep(args.seconds / 3)
    backend.kill()
    backend.wait()
    killed = time.monotonic()
    detect = await asyncio.to_thread(poll, lambda: status(base) == 503, 10)
    await asyncio.sleep(max(0.0, args.outage - (time.monotonic() - killed)))
    restarted = time.monotonic()
    backend = emulator(bport)
    recover = await asyncio.to_thread(poll, lambda: status(base) == 200, 10)
    up_after = time.monotonic() - restarted
    await asyncio.gather(*tasks)
    counts = counted(base)
    client_side = {o: seen.count(o) for o in sorted(set(seen))}
    ok = consistent(base)
    gw.terminate()
    gw.wait(60)
    backend.kill()
    backend.wait()
    lost = len(seen) - sum(counts.values())
    rows = [
        f"| {args.clients} streaming clients for {args.seconds} s, the only backend killed (SIGKILL) for "
        f"{restarted - killed:.1f} s, then restarted | {len(seen)} requests: {client_side}; down detected in "
        f"{detect:.2f} s, back {recover:.2f} s after the restarted backend answered "
        f"(the restart took {up_after - recover:.1f} s) | "
        f"{lost} lost; outcomes in /metrics {counts}; accounts consistent: {ok} |"
    ]
    return rows


async def hanging() -> list[str]:
    bport, gport = free_port(), free_port()
    base = f"http://127.0.0.1:{gport}"
    backend = emulator(bport, "--hang-rate", "1")
    gw = gateway(gport, bport, "--request-timeout", "2")
    start_ = time.monotonic()
    async with httpx.AsyncClient(timeout=60) as c:
        seen = await asyncio.gather(*(stream(c, base, "k1", 8) for _ in range(20)))
    took = time.monotonic() - start_
    counts = counted(base)
    gw.terminate()
    gw.wait(60)
    backend.kill()
    backend.wait()
    return [
        f"| 20 requests to a backend that never answers (`request_timeout_s` = 2) | "
        f"{ {o: seen.count(o) for o in set(seen)} } in {took:.1f} s | {20 - sum(counts.values()):.0f} lost; "
        f"{counts} |"
    ]


def stalled_uploads() -> list[str]:
    bport, gport = free_port(), free_port()
    backend = emulator(bport)
    gw = gateway(gport, bport, "--client-timeout", "5")
    socks = []
    for _ in range(200):
        s = socket.create_connection(("127.0.0.1", gport))
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k1\r\n"
            b'content-type: application/json\r\ncontent-length: 100000\r\n\r\n{"model":'
        )
        socks.append(s)
    start_ = time.monotonic()
    answers = []
    for s in socks:
        s.settimeout(30)
        data = b""
        with contextlib.suppress(OSError):
            while piece := s.recv(65536):
                data += piece
        answers.append(data[:12].decode(errors="replace"))
        s.close()
    took = time.monotonic() - start_
    gw.terminate()
    gw.wait(60)
    backend.kill()
    backend.wait()
    return [
        f"| 200 connections that send headers and a partial body, then stall (`client_timeout_s` = 5) | "
        f"{answers.count('HTTP/1.1 408')} answered 408 and closed within {took:.1f} s | none held |"
    ]


async def drain() -> list[str]:
    bport, gport = free_port(), free_port()
    base = f"http://127.0.0.1:{gport}"
    backend = emulator(bport)
    gw = gateway(gport, bport, "--drain-timeout", "3")
    async with httpx.AsyncClient(timeout=120) as c:
        tasks = [asyncio.create_task(stream(c, base, "k2", 2000)) for _ in range(8)]
        await asyncio.to_thread(
            poll, lambda: httpx.get(base + "/healthz").json()["backends"][0]["in_flight_requests"] == 8, 20
        )
        start_ = time.monotonic()
        gw.send_signal(signal.SIGTERM)
        seen = await asyncio.gather(*tasks)
        ended = time.monotonic() - start_
    gw.wait(60)
    exited = time.monotonic() - start_
    backend.kill()
    backend.wait()
    return [
        f"| SIGTERM with 8 long requests in flight (`drain_timeout_s` = 3) | all 8 ended after {ended:.1f} s: "
        f"{seen.count('shutdown')} streams with the `shutdown` error event, {seen.count('503')} not yet "
        f"streaming with 503; the process exited after {exited:.1f} s | each charged what it produced |"
    ]


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=48)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--outage", type=float, default=5)
    args = p.parse_args()
    rows = ["| fault | what happened | nothing lost |", "|---|---|---|"]
    rows += await outage(args)
    rows += await hanging()
    rows += await asyncio.to_thread(stalled_uploads)
    rows += await drain()
    print("\n".join(rows))


if __name__ == "__main__":
    asyncio.run(main())
