"""Prefix-aware dispatch through HTTP: the gateway with `dispatch = "least_loaded"` against `dispatch = "prefix"`, each
in front of the same two emulated backends with prefix caches (`fairserve emulate --engine-mode paged --prefix-cache`,
pools of 4,384 tokens: about half of the tenants' prompts each), VTC in both, the requests sent with the official
`openai` client (streamed, so the time to first token is the client's).

Workloads: `system-prompts` (eight tenants, each its own 1,000-token system prompt and a 64-token question) and
`no-sharing` (the same sizes, nothing shared), 60 s of arrivals at `--time-scale` (simulated seconds per wall second);
the prompts' text shares exactly the workload's declared prefixes and nothing else (api/prefix.py `prompt_text`).
Rounds alternate the two gateways on fresh backends (empty caches). Reported per gateway (medians over rounds):
output tokens per simulated second (all requests drained), the backends' prefix-cache hit rate (their
`vllm:prefix_cache_hits` / `_queries`), each tenant's share of the service, and the worst tenant's median time to
first token.

Run: .venv/bin/python benchmarks/prefix_dispatch.py [--rounds 3] [--time-scale 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.processes import serve  # noqa: E402

from fairserve.api.prefix import prompt_text  # noqa: E402
from fairserve.workloads import Arrival, get_workload  # noqa: E402

KV = 4_384


def counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


async def replay(gateway: str, workload: str, scale: float, keys: dict[str, str]) -> dict[str, object]:
    w = get_workload(workload)
    clients = {c: openai.AsyncOpenAI(base_url=gateway + "/v1", api_key=k, max_retries=0) for c, k in keys.items()}
    ttft: dict[str, list[float]] = {c: [] for c in keys}
    service: dict[str, float] = dict.fromkeys(keys, 0.0)
    out = 0
    start = time.monotonic()

    async def one(i: int, a: Arrival) -> None:
        nonlocal out
        await asyncio.sleep(max(0.0, start + a.arrival_s / scale - time.monotonic()))
        # NOTE: every prompt its own text past its declared prefix (bench's own text for a prompt without one is
        # the same for all: every backend would find it)
        text = prompt_text(a.prompt_tokens, a.prefix, (a.client, i))
        sent = time.monotonic()
        first = None
        stream = await clients[a.client].chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": text}],
            max_tokens=a.output_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic()
            if chunk.usage is not None:
                out += chunk.usage.completion_tokens
                service[a.client] += chunk.usage.prompt_tokens + 2 * chunk.usage.completion_tokens
        if first is not None:
            ttft[a.client].append((first - sent) * scale)

    await asyncio.gather(*(one(i, a) for i, a in enumerate(w.arrivals)))
    wall = time.monotonic() - start
    for c in clients.values():
        await c.close()
    total = sum(service.values())
    return {
        "tokens_per_s": out / (wall * scale),
        "shares": {c: v / total for c, v in service.items()},
        "worst_ttft": max(statistics.median(v) for v in ttft.values() if v),
    }


def run_once(rule: str, workload: str, scale: float) -> dict[str, object]:
    keys = {f"client-{i}": f"sk-client-{i}" for i in range(8)}
    emulate = ["emulate", "--engine-mode", "paged", "--prefix-cache", "--kv-tokens", str(KV)]
    emulate += ["--time-scale", str(scale)]
    with contextlib.ExitStack() as stack:
        backends = [stack.enter_context(serve(*emulate)) for _ in range(2)]
        args = ["gateway", "--dispatch", rule]
        for b in backends:
            args += ["--backend", f"{b},max_requests=16"]
        for c, k in keys.items():
            args += ["--tenant", f"{c}:{k}"]
        gateway = stack.enter_context(serve(*args))
        result = asyncio.run(replay(gateway, workload, scale, keys))
        hits = sum(counters(b).get("vllm:prefix_cache_hits_total", 0.0) for b in backends)
        queries = sum(counters(b).get("vllm:prefix_cache_queries_total", 0.0) for b in backends)
        result["hit_rate"] = hits / queries if queries else 0.0
        return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=10.0)
    a = ap.parse_args()
    rules = ("least_loaded", "prefix")
    for workload in ("system-prompts", "no-sharing"):
        runs: dict[str, list[dict[str, object]]] = {r: [] for r in rules}
        for i in range(a.rounds):
            for rule in rules if i % 2 == 0 else rules[::-1]:
                runs[rule].append(run_once(rule, workload, a.time_scale))
        print(f"\n{workload}, two emulated backends of {KV:,} tokens with prefix caches, VTC; medians of {a.rounds}")
        print("\n| dispatch | output tokens/s | hit rate | worst tenant's median TTFT (s) | shares |")
        print("|---|---:|---:|---:|---|")
        for rule in rules:
            rs = runs[rule]
            rate = statistics.median(float(r["tokens_per_s"]) for r in rs)  # type: ignore[arg-type]
            hit = statistics.median(float(r["hit_rate"]) for r in rs)  # type: ignore[arg-type]
            worst = statistics.median(float(r["worst_ttft"]) for r in rs)  # type: ignore[arg-type]
            shares = rs[len(rs) // 2]["shares"]
            spread = f"{min(shares.values()):.3f}–{max(shares.values()):.3f}"  # type: ignore[attr-defined]
            print(f"| {rule} | {rate:,.0f} | {hit:.3f} | {worst:.2f} | {spread} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
