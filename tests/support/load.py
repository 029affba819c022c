"""Streamed requests through a gateway to a faulty emulator, 64 at a time, and the check that nothing was lost
(tests/test_load.py sends 600; benchmarks/load.py 10,000)."""

import asyncio
import re

import httpx

from fairserve.api.tokens import prompt_of
from support.processes import serve

TENANTS = {f"t{i}": f"key-{i}" for i in range(4)}


RETRIES: list[int] = []


async def stream_one(client: httpx.AsyncClient, url: str, key: str) -> str:
    body = {"model": "m", "prompt": prompt_of(8), "max_tokens": 3, "stream": True}
    for attempt in range(3):
        answered = False
        try:
            async with client.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
                answered = True
                if r.status_code != 200:
                    await r.aread()
                    return f"http-{r.status_code}"
                done = False
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: ") and '"error"' in line:
                        return "stream-error"
                return "ok" if done else "cut"
        except httpx.TransportError:
            if answered:
                return "cut"
            # NOTE: a pooled keep-alive connection can be closed under us before the request is sent; like the
            # openai client, retry what got no answer at all
            RETRIES.append(attempt)
    return "unanswered"


async def hammer(url: str, requests: int) -> list[str]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        sem = asyncio.Semaphore(64)
        keys = list(TENANTS.values())

        async def one(i: int) -> str:
            async with sem:
                return await stream_one(client, url + "/v1/completions", keys[i % len(keys)])

        return await asyncio.gather(*(one(i) for i in range(requests)))


def outcomes_from_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in re.finditer(r"^fairserve_gateway_requests_total\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        out[labels["outcome"]] = out.get(labels["outcome"], 0) + float(m.group(2))
    return out


def run_load(requests: int) -> tuple[dict[str, int], dict[str, float], int]:
    """`requests` streams through a gateway to an emulator that fails 3% at once and cuts 3% mid-stream: (outcomes at
    the client, outcomes in the gateway's metrics, retries of requests that got no answer)."""
    RETRIES.clear()
    with serve(
        "emulate", "--time-scale", "1000", "--error-rate", "0.03", "--drop-rate", "0.03", "--seed", "7"
    ) as emulator:
        with serve(
            "gateway",
            "--backend",
            f"{emulator},max_requests=48",
            "--queue-limit",
            "20000",
            *(f"--tenant={t}:{k}" for t, k in TENANTS.items()),
        ) as gateway:
            seen = asyncio.run(hammer(gateway, requests))
            metrics = httpx.get(gateway + "/metrics").text
    assert len(seen) == requests
    return {o: seen.count(o) for o in set(seen)}, outcomes_from_metrics(metrics), len(RETRIES)


def check_nothing_lost(requests: int, counts: dict[str, int], recorded: dict[str, float], retries: int) -> None:
    assert "unanswered" not in counts and "cut" not in counts, counts
    # every request has one outcome in the gateway (an attempt retried without an answer may have reached it too)
    assert requests <= sum(recorded.values()) <= requests + retries, (counts, recorded, retries)
    assert recorded.get("ok", 0) == counts.get("ok", 0)  # and the client saw the same
    assert counts.get("ok", 0) > 0.85 * requests
    assert requests - counts.get("ok", 0) > 0  # the faults did happen
    assert set(counts) <= {"ok", "http-502", "stream-error"}, counts
