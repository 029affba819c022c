"""Gateway overhead against the same emulator, measured side by side in one run: requests sent directly to
`fairserve emulate` and through `fairserve gateway` in front of it, as a user starts it (defaults but the backend
and one tenant).

Per path and round: non-streamed latency one request at a time (p50, p99, p99.9, max over every round's
`--sequential` requests), the time to the first token of a stream one at a time (p50, p99), non-streamed requests/s
with 32 and 128 at a time (`--concurrency`), and the gateway process's CPU time per request over the round (from
/proc). One aiohttp client (on uvloop where installed), the emulated GPU made instant so that only HTTP and
scheduling count; every path sees every round (interleaved), and the load average is printed beside the medians.
Targets (issue 51): ≤ 0.5 ms p50 and ≤ 2 ms p99 added, p99.9 ≤ 10 ms (no collector pause), ≥ 0.8× direct throughput
at 32 and 128, ≤ 0.35 ms of gateway CPU per request.
`--base DIR`: the gateway of DIR's checkout of fairserve (its `src/`) side by side, so that a change is measured
against the code before it; `--variant FLAGS` (repeatable): this tree's gateway with more flags (`--access-log`).
`--tenants N`: the gateways configured with N tenants in a 3-level tree (benchmarks/config_scale.py's), requests from
one of them. `--redis`: a redis-server for variants with shared state (`--variant "--workers 2 --state {redis}"`);
the CPU per request of `--workers N` counts the workers' (the parent's children).
LiteLLM's proxy is a path too, automatically when the venv of scripts/litellm_env.sh exists (made once, from the
package registry; `--litellm` insists on it, failing without it, `--no-litellm` leaves it out): started from that
venv on a loopback port as an operator runs it (a generated config with the emulator as the OpenAI-compatible
`openai/m` at its /v1, a master key, no database, its defaults otherwise: one uvicorn worker, access log on), with
nothing fetched while it runs (the model cost map from the package, LiteLLM's telemetry off), stopped at the end
whatever happens; its CPU per request is counted as fairserve's is, and the seconds it took to answer are printed.
Run: .venv/bin/python benchmarks/gateway_overhead.py [--sequential 1000] [--requests 1000] [--concurrency 32,128]
     [--rounds 5] [--base DIR] [--variant FLAGS] [--tenants N] [--redis] [--litellm | --no-litellm]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.processes import fairserve_process, serve  # noqa: E402  (the loopback subprocess helpers of the tests)

from fairserve.api.server import free_port  # noqa: E402
from fairserve.api.tokens import prompt_of  # noqa: E402

BODY = {"model": "m", "prompt": prompt_of(8), "max_tokens": 4, "stream": True}


async def one(client: httpx.AsyncClient, url: str) -> float:
    t = time.perf_counter()
    async with client.stream("POST", url, json=BODY, headers={"Authorization": "Bearer key-a"}) as r:
        async for _ in r.aiter_lines():
            pass
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}")
    return time.perf_counter() - t


async def measure(base: str, requests: int, concurrency: int) -> tuple[list[float], float]:
    url = base + "/v1/completions"
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:
        for _ in range(20):
            await one(client, url)  # warm up
        latencies = [await one(client, url) for _ in range(requests // 4)]
        sem = asyncio.Semaphore(concurrency)

        async def limited() -> float:
            async with sem:
                return await one(client, url)

        t = time.perf_counter()
        await asyncio.gather(*(limited() for _ in range(requests)))
        return latencies, requests / (time.perf_counter() - t)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def load_args(prog: str, doc: str, tenants: bool = False, base: bool = False) -> argparse.Namespace | None:
    """--requests, --concurrency, --rounds (None, after one line on stderr, when one is below 1); with `tenants`,
    --tenants N,N,... too."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    if base:
        p.add_argument("--base", type=Path, help="another checkout of fairserve, measured side by side")
    if tenants:
        p.add_argument("--tenants", type=lambda v: [int(x) for x in v.split(",")], default=[10, 100, 1000, 10000])
    a = p.parse_args()
    if min(a.requests, a.concurrency, a.rounds) < 1:
        print(f"{prog}: --requests, --concurrency and --rounds must be >= 1", file=sys.stderr)
        return None
    return a


def table(first: str, rows: dict[str, list]) -> dict[str, tuple[float, float, float]]:
    """Print p50/p99 latency and the median throughput of each row's rounds; return them by row."""
    stats = {}
    for name, runs in rows.items():
        lat = [x for latencies, _ in runs for x in latencies]
        stats[name] = (pct(lat, 0.5), pct(lat, 0.99), statistics.median(r for _, r in runs))
    print(f"| {first} | stream latency p50 (ms) | p99 (ms) | streamed requests/s |")
    print("|---|---:|---:|---:|")
    for name, (p50, p99, rps) in stats.items():
        print(f"| {name} | {p50:.2f} | {p99:.2f} | {rps:.0f} |")
    print()
    return stats


NONSTREAM = {"model": "m", "prompt": prompt_of(8), "max_tokens": 4}
STREAM = {**NONSTREAM, "stream": True}


async def run_path(url: str, key: str, sequential: int, requests: int, levels: list[int]) -> dict[str, Any]:
    """One round on one path: latencies one at a time, then the rate at each concurrency level."""
    import aiohttp

    out: dict[str, Any] = {"latency": [], "ttft": [], "rate": {}, "errors": []}
    headers = {"Authorization": f"Bearer {key}"}
    target = url + "/v1/completions"
    connector = aiohttp.TCPConnector(limit=max(levels))
    async with aiohttp.ClientSession(connector=connector, headers=headers) as http:

        async def plain() -> float | None:
            """Its latency, None (the answer kept in `errors`) when it is not a 200."""
            t = time.perf_counter()
            async with http.post(target, json=NONSTREAM) as r:
                body = await r.read()
            if r.status != 200:
                out["errors"].append(f"HTTP {r.status}: {body[:200]!r}")
                return None
            return time.perf_counter() - t

        async def first_token() -> float | None:
            t = time.perf_counter()
            first, body = None, b""
            async with http.post(target, json=STREAM) as r:
                async for line in r.content:
                    body += line if r.status != 200 else b""
                    if first is None and line.startswith(b"data: {"):
                        first = time.perf_counter() - t
            if r.status != 200 or first is None:
                out["errors"].append(f"stream HTTP {r.status}: {body[:200]!r}")
            return first if r.status == 200 else None

        for _ in range(50):
            await plain()  # warm up
        out["latency"] = [x for _ in range(sequential) if (x := await plain()) is not None]
        out["ttft"] = [x for _ in range(max(1, sequential // 4)) if (x := await first_token()) is not None]
        for level in levels:
            sem = asyncio.Semaphore(level)

            async def limited(sem: asyncio.Semaphore) -> None:
                async with sem:
                    await plain()

            t = time.perf_counter()
            await asyncio.gather(*(limited(sem) for _ in range(requests)))
            out["rate"][level] = requests / (time.perf_counter() - t)
    out["requests"] = 50 + sequential + max(1, sequential // 4) + requests * len(levels)
    return out


def cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds and its children's, live ones (`--workers N`) included (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return own + sum(cpu_s(c) for c in children)


def big_config(path: Path, n: int) -> None:
    """`n` tenants in a 3-level tree, as config_scale.py writes them (`tier{i%10}/org{i//100}/u{i}`, key `key-{i}`)."""
    from config_scale import write_config

    write_config(path, n)


LITELLM_KEY = "sk-fairserve-bench"  # the proxy's master key, the bearer token of its path


def litellm_venv() -> Path:
    """Where scripts/litellm_env.sh makes its venv (FAIRSERVE_LITELLM_VENV, else under XDG_CACHE_HOME or ~/.cache)."""
    if venv := os.environ.get("FAIRSERVE_LITELLM_VENV"):
        return Path(venv)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fairserve" / "litellm-venv"


def litellm_ready(venv: Path) -> bool:
    """Whether the script finished that venv (its stamp is written last)."""
    return (venv / ".fairserve-litellm").is_file() and (venv / "bin" / "litellm").is_file()


@contextlib.contextmanager
def litellm_proxy(
    venv: Path, backend: str, workdir: Path, timeout_s: float = 180.0
) -> Iterator[tuple[str, int, float]]:
    """LiteLLM's proxy from `venv` on a loopback port in front of `backend` (an OpenAI-compatible server); yields
    (url, pid, seconds until /health/liveliness answered) and stops it on exit, also after an error."""
    config = workdir / "litellm.yaml"
    model = {"model_name": "m", "litellm_params": {"model": "openai/m", "api_base": backend + "/v1", "api_key": "none"}}
    # JSON is YAML; no database_url: keys, spend and the rest stay in memory
    config.write_text(json.dumps({"model_list": [model], "general_settings": {"master_key": LITELLM_KEY}}))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DIRECT_URL", "REDIS_URL", "PYTHONPATH")}
    env |= {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the cost map shipped in the package, not fetched
        "LITELLM_TELEMETRY_DISABLED": "true",
    }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    log = tempfile.TemporaryFile()  # NOTE: not a pipe (it logs every request); its cwd has no .env for it to load
    t = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    try:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health/liveliness", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() - t > timeout_s:
                log.seek(0)
                raise RuntimeError(f"LiteLLM's proxy did not start: {log.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.1)
        yield url, proc.pid, time.monotonic() - t
    finally:
        if proc.poll() is None:
            t = time.monotonic()
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            print(f"(LiteLLM's proxy stopped in {time.monotonic() - t:.1f} s)", file=sys.stderr)
        log.close()


def litellm_about(venv: Path) -> tuple[str, str]:
    """The venv's LiteLLM version and which of uvloop and httptools its uvicorn finds (without importing LiteLLM)."""
    code = (
        "import importlib.metadata as m, importlib.util as u; print(m.version('litellm')); "
        "print(', '.join(x for x in ('uvloop', 'httptools') if u.find_spec(x)) or 'neither')"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    version, servers = out.stdout.splitlines()
    return version, servers


def main() -> int:
    p = argparse.ArgumentParser(prog="gateway_overhead.py", description=__doc__.splitlines()[0])
    p.add_argument("--sequential", type=int, default=1000, help="requests one at a time per path and round")
    p.add_argument("--requests", type=int, default=1000, help="requests per concurrency level per path and round")
    p.add_argument("--concurrency", type=lambda v: [int(x) for x in v.split(",")], default=[32, 128])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--base", type=Path, help="another checkout of fairserve, measured side by side")
    p.add_argument("--variant", action="append", default=[], help="this tree's gateway with these flags too")
    p.add_argument("--tenants", type=int, default=1)
    p.add_argument(
        "--redis", action="store_true", help="start a redis-server; `{redis}` in a variant's flags is its URL"
    )
    p.add_argument(
        "--litellm",
        action=argparse.BooleanOptionalAction,
        help="LiteLLM's proxy as a path (default: when scripts/litellm_env.sh's venv exists)",
    )
    a = p.parse_args()
    venv = litellm_venv()
    if a.litellm and not litellm_ready(venv):
        print(f"gateway_overhead.py: --litellm: no venv at {venv} (scripts/litellm_env.sh makes it)", file=sys.stderr)
        return 2
    litellm = litellm_ready(venv) if a.litellm is None else a.litellm
    if min(a.sequential, a.requests, a.rounds, *a.concurrency) < 1:
        print("gateway_overhead.py: every count must be >= 1", file=sys.stderr)
        return 2
    if a.base is not None and not (a.base / "src" / "fairserve").is_dir():
        print(f"gateway_overhead.py: --base {a.base}: no src/fairserve there", file=sys.stderr)
        return 2
    run: Callable[..., Any]
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if a.tenants > 1:
            config = Path(tmp) / "gateway.toml"
            big_config(config, a.tenants)
            tenant_args, key = ["--config", str(config)], f"key-{a.tenants // 2}"
        else:
            tenant_args, key = ["--tenant=a:key-a"], "key-a"
        # NOTE: time scale 1e6 makes the emulated GPU instant, so what is measured is HTTP and scheduling
        # NOTE: with --base, the emulator is the base tree's (the same server for every path, whatever changes here)
        where = {"PYTHONPATH": str(a.base.resolve() / "src")} if a.base is not None else None
        emulator = stack.enter_context(serve("emulate", "--time-scale", "1000000", env=where))
        backend = f"--backend={emulator},max_requests=256"
        paths: dict[str, tuple[str, int | None, str]] = {"direct": (emulator, None, key)}  # URL, CPU's pid, key

        def gateway(*flags: str, env: dict[str, str] | None = None) -> tuple[str, int, str]:
            url, proc = stack.enter_context(
                fairserve_process("gateway", *tenant_args, backend, *flags, env=env, timeout_s=300)
            )
            return url, proc.pid, key

        paths["fairserve"] = gateway()
        if a.base is not None:
            paths[f"fairserve at {a.base}"] = gateway(env={"PYTHONPATH": str(a.base.resolve() / "src")})
        if a.redis:
            from support.redis_server import redis_server

            redis_url = stack.enter_context(redis_server()).url
        for flags in a.variant:
            shown = flags.replace("{redis}", "redis://…")
            paths[f"fairserve {shown}"] = gateway(*flags.replace("{redis}", redis_url if a.redis else "").split())
        if litellm:
            version, servers = litellm_about(venv)
            name = f"LiteLLM {version}"
            proxy_url, proxy_pid, started_s = stack.enter_context(litellm_proxy(venv, emulator, Path(tmp)))
            paths[name] = (proxy_url, proxy_pid, LITELLM_KEY)
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
        loads = []
        names = list(paths)
        for r in range(a.rounds):  # interleaved, so every path sees the same machine; the gateways' order rotated
            loads.append(os.getloadavg()[0])
            gateways = names[1:]
            for name in [names[0], *gateways[r % len(gateways) :], *gateways[: r % len(gateways)]]:
                url, pid, token = paths[name]
                before = cpu_s(pid) if pid is not None else 0.0
                got = run(run_path(url, token, a.sequential, a.requests, a.concurrency))
                got["cpu_ms"] = (cpu_s(pid) - before) / got["requests"] * 1000 if pid is not None else None
                rounds[name].append(got)
    print_table(rounds, a.concurrency)
    for name, runs in rounds.items():
        if errors := [e for r in runs for e in r["errors"]]:
            print(f"{name}: {len(errors)} requests not answered 200, e.g. {errors[0]}")
    print(
        f"({a.rounds} rounds of {a.sequential} requests one at a time, {max(1, a.sequential // 4)} streams and "
        f"{a.requests} at each concurrency; {a.tenants:,} tenant(s); load average at each round's start: median "
        f"{statistics.median(loads):.2f}, {min(loads):.2f}-{max(loads):.2f}; client on "
        f"{'uvloop' if run is not asyncio.run else 'asyncio'}; uvloop/httptools installed for uvicorn: "
        f"{', '.join(m for m in ('uvloop', 'httptools') if importlib.util.find_spec(m)) or 'neither'})"
    )
    if litellm:
        print(
            f"({name}'s proxy answered {started_s:.1f} s after its start; its venv ({venv}) has for uvicorn: {servers})"
        )
    return 0


def print_table(rounds: dict[str, list[dict[str, Any]]], levels: list[int]) -> None:
    stats = {}
    for name, runs in rounds.items():
        lat = [x for r in runs for x in r["latency"]]
        ttft = [x for r in runs for x in r["ttft"]]
        cpu = [r["cpu_ms"] for r in runs if r["cpu_ms"] is not None]
        stats[name] = {
            "p50": pct(lat, 0.5),
            "p99": pct(lat, 0.99),
            "p999": pct(lat, 0.999),
            "max": max(lat) * 1000,
            "t50": pct(ttft, 0.5),
            "t99": pct(ttft, 0.99),
            **{f"r{n}": statistics.median(r["rate"][n] for r in runs) for n in levels},
            "cpu": statistics.median(cpu) if cpu else None,
        }
    rates = " | ".join(f"req/s at {n}" for n in levels)
    print(f"| path | p50 (ms) | p99 | p99.9 | max | TTFT p50 | TTFT p99 | {rates} | gateway CPU per request (ms) |")
    print("|---|" + "---:|" * (7 + len(levels)))
    for name, x in stats.items():
        cells = [f"{x[k]:.2f}" for k in ("p50", "p99", "p999", "max", "t50", "t99")]
        cells += [f"{x[f'r{n}']:.0f}" for n in levels]
        cells.append(f"{x['cpu']:.3f}" if x["cpu"] is not None else "—")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    d = stats["direct"]
    for name, x in list(stats.items())[1:]:
        ratios = ", ".join(f"{x[f'r{n}'] / d[f'r{n}']:.2f}× at {n}" for n in levels)
        print(
            f"added by {name}: p50 {x['p50'] - d['p50']:.2f} ms, p99 {x['p99'] - d['p99']:.2f} ms, p99.9 "
            f"{x['p999'] - d['p999']:.2f} ms, TTFT p50 {x['t50'] - d['t50']:.2f} ms, p99 {x['t99'] - d['t99']:.2f} ms;"
            f" throughput {ratios} direct"
        )
    print()


if __name__ == "__main__":
    sys.exit(main())
