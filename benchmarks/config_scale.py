"""Configuration at scale: a gateway config of 10,000 and 100,000 tenants in a 3-level tree (`tier/org/tenant`, a key
each, 10 tier groups with weights), read, checked and reloaded live.

Per tree and tenant count, each in a fresh child process: the file's size; `load` (read, parse and validate the file:
what a reload runs off the event loop); `check_tenants` alone (names, paths, groups and keys across tenants); `start`
(the gateway made from the config); `reload` (`POST /admin/reload`'s work: 10 weights changed and one tenant added;
the second reload, which frees the config of the first; what the gateway holds frozen first, as `fairserve gateway`
does, where the tree has gateway/settings/pauses.py): its wall time and the longest the event loop went without
running a task during it (a 1 ms ticker: what a request in flight would wait). `--base DIR` (and more `--tree DIR`)
run another checkout's `src/` the same way, interleaved, so a change is measured against the code before it. Goal
(issue 51): linear in tenants; a reload at 100,000 tenants holds the loop <= 5 ms.

`--live N`, instead: each tree's `fairserve gateway` in its own process on a file of N tenants, in front of the same
emulator, reloaded (`POST /admin/reload`, 10 more weights changed and one more tenant each time) while requests are
sent one at a time, rounds interleaved: the reload's time, the requests in flight during it, the p99 of the others and
the largest of those in flight. Goal (issue 51): ≤ 5 ms above p99 at 100,000 tenants.

Run: .venv/bin/python benchmarks/config_scale.py [--tenants 10000,100000] [--rounds 3] [--base DIR] [--tree DIR]
     [--timeout 300] [--live N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("load", "check_tenants", "start", "reload", "loop held")


def write_config(path: Path, n: int, changed: int = 0, added: int = 0, backend: str = "http://127.0.0.1:9") -> None:
    """`n` tenants `tier{i%10}/org{i//100}/u{i}`, one key each; `changed`: the first ones' weights changed; `added`:
    more tenants after them."""
    out = [
        'admin_key = "admin"',
        "health_interval_s = 0",
        f'[[backends]]\nurl = "{backend}"\nmax_inflight_requests = 256',
    ]
    out += [f'[[groups]]\nname = "tier{g}"\nweight = {g + 1}' for g in range(10)]
    for i in range(n + added):
        w = 7.5 if i < changed else 1.0 + (i % 3)
        out.append(f'[[tenants]]\nname = "tier{i % 10}/org{i // 100}/u{i}"\napi_keys = ["key-{i}"]\nweight = {w}')
    path.write_text("\n".join(out) + "\n")


def child(n: int) -> dict[str, float]:
    """One measurement, in this (fresh) process, of the `fairserve` on its path."""
    from fairserve.gateway import create_app, load_config
    from fairserve.tenancy import check_tenants

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "gateway.toml"
        write_config(path, n)
        out = {"bytes": path.stat().st_size}
        t = time.perf_counter()
        cfg = load_config(path)
        out["load"] = time.perf_counter() - t
        t = time.perf_counter()
        check_tenants(cfg.tenants, cfg.admin_key, cfg.groups)
        out["check_tenants"] = time.perf_counter() - t
        t = time.perf_counter()
        app = create_app(cfg, lambda: load_config(path))
        out["start"] = time.perf_counter() - t
        gw = app.state.gateway
        try:  # NOTE: as `fairserve gateway` does once started, where this tree has it (issue 51)
            from fairserve.gateway.settings import pauses

            pauses.settle()
            gw.frozen = True
        except ImportError:
            pass
        write_config(path, n, changed=10, added=1)

        async def reload() -> None:
            await gw.reload()  # NOTE: the first: the config the gateway started with stays held (by the app)
            write_config(path, n, changed=20, added=2)
            held = 0.0
            done = False

            async def ticker() -> None:
                nonlocal held
                while not done:
                    t = time.perf_counter()
                    await asyncio.sleep(0.001)
                    held = max(held, time.perf_counter() - t - 0.001)

            tick = asyncio.create_task(ticker())
            await asyncio.sleep(0.01)
            t = time.perf_counter()
            line = await gw.reload()  # NOTE: measured: the config before it is freed
            out["reload"] = time.perf_counter() - t
            done = True
            await tick
            out["loop held"] = held
            assert "1 added" in line, line

        asyncio.run(reload())
    return out


def run_child(src: Path, n: int, timeout_s: float) -> dict[str, float] | None:
    env = {**os.environ, "PYTHONPATH": str(src)}
    try:
        p = subprocess.run(
            [sys.executable, __file__, "--child", str(n)], env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return None
    if p.returncode != 0:
        raise RuntimeError(f"{src}: {n} tenants: {p.stderr[-2000:]}")
    return json.loads(p.stdout.splitlines()[-1])


async def live_round(url: str, key: str, seconds: float = 4.0) -> dict[str, float]:
    """Requests one at a time for `seconds`, `POST /admin/reload` 1 s in: the reload's time, the requests in flight
    during it, the p99 of the others and the largest of those in flight."""
    import aiohttp

    spans: list[tuple[float, float]] = []
    body = {"model": "m", "prompt": "hello there", "max_tokens": 4}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:

        async def traffic() -> None:
            end = time.perf_counter() + seconds
            while (t := time.perf_counter()) < end:
                async with http.post(url + "/v1/completions", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: HTTP {r.status}")
                spans.append((t, time.perf_counter()))

        async def reload() -> tuple[float, float]:
            await asyncio.sleep(1.0)
            t = time.perf_counter()
            async with http.post(url + "/admin/reload", headers={"Authorization": "Bearer admin"}) as r:
                answer = await r.json()
            if r.status != 200:
                raise RuntimeError(f"{url}: reload refused: {answer}")
            return t, time.perf_counter()

        _, (start, end) = await asyncio.gather(traffic(), reload())
    during = [b - a for a, b in spans if a < end and b > start]
    other = sorted(b - a for a, b in spans if not (a < end and b > start))
    return {
        "reload": end - start,
        "during": len(during),
        "p99": other[int(0.99 * len(other))],
        "largest": max(during, default=0.0),
    }


def live(trees: dict[str, Path], n: int, rounds: int, emulator_src: Path) -> None:
    """Each tree's `fairserve gateway` on a file of `n` tenants, reloaded under traffic `rounds` times (after one
    reload unmeasured: each measured one frees the config of the one before), rounds interleaved."""
    import contextlib
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    from support.processes import fairserve_process, serve

    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        emulator = stack.enter_context(
            serve("emulate", "--time-scale", "1000000", env={"PYTHONPATH": str(emulator_src)})
        )
        gateways = {}
        for i, (name, src) in enumerate(trees.items()):
            path = Path(tmp) / f"gateway-{i}.toml"
            write_config(path, n, backend=emulator)
            url, _ = stack.enter_context(
                fairserve_process("gateway", "--config", str(path), env={"PYTHONPATH": str(src)}, timeout_s=300)
            )
            gateways[name] = (url, path)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for r in range(rounds + 1):
            for name, (url, path) in gateways.items():
                write_config(path, n, changed=10 * (r + 1), added=r + 1, backend=emulator)
                got = run(live_round(url, f"key-{n // 2}"))
                if r:  # NOTE: the first reload frees the config the gateway started with: not measured
                    results[name].append(got)
    print(f"\nA reload under traffic, {n:,} tenants (requests one at a time; medians of {rounds} rounds):\n")
    print("| tree | reload | requests during it | p99 of the others | largest during it | above p99 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        m = {k: statistics.median(x[k] for x in runs) for k in ("reload", "during", "p99", "largest")}
        worst = max(x["largest"] - x["p99"] for x in runs)
        print(
            f"| {name} | {m['reload']:.2f} s | {m['during']:.0f} | {m['p99'] * 1000:.2f} ms | "
            f"{m['largest'] * 1000:.2f} ms | {(m['largest'] - m['p99']) * 1000:.2f} ms (worst round "
            f"{worst * 1000:.2f}) |"
        )


def fmt(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def main() -> int:
    p = argparse.ArgumentParser(prog="config_scale.py", description=__doc__.splitlines()[0])
    p.add_argument("--tenants", type=lambda v: [int(x) for x in v.split(",")], default=[10_000, 100_000])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--base", type=Path, help="another checkout of fairserve, measured side by side")
    p.add_argument("--tree", type=Path, action="append", default=[], help="one more checkout (repeatable)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one child may take (else —)")
    p.add_argument("--live", type=int, metavar="N", help="instead: a reload under traffic, N tenants")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.child)))
        return 0
    trees = {"this tree": ROOT / "src"}
    for other in [*([a.base] if a.base else []), *a.tree]:
        if not (other / "src" / "fairserve").is_dir():
            print(f"config_scale.py: {other}: no src/fairserve there", file=sys.stderr)
            return 2
        trees[str(other)] = other.resolve() / "src"
    if a.live is not None:
        live(trees, a.live, a.rounds, trees[str(a.base)] if a.base else trees["this tree"])
        return 0
    results: dict[tuple[str, int], list[dict[str, float] | None]] = {(t, n): [] for n in a.tenants for t in trees}
    for _ in range(a.rounds):  # interleaved, so every tree sees the same machine
        for n in a.tenants:
            for name, src in trees.items():
                results[name, n].append(run_child(src, n, a.timeout))
    print("| tree | tenants | file | " + " | ".join(STEPS) + " |")
    print("|---|---:|---:|" + "---:|" * len(STEPS))
    for (name, n), runs in results.items():
        done = [r for r in runs if r is not None]
        if not done:
            print(f"| {name} | {n:,} | — |" + " — (over the timeout) |" * len(STEPS))
            continue
        cells = [fmt(statistics.median(r[s] for r in done)) for s in STEPS]
        print(f"| {name} | {n:,} | {done[0]['bytes'] / 2**20:.1f} MiB | " + " | ".join(cells) + " |")
    load = os.getloadavg()
    print(f"\n(medians of {a.rounds} rounds, each a fresh process; load average {' '.join(f'{x:.2f}' for x in load)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
