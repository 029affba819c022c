"""The backends reload live, proved against real processes: two `fairserve emulate` backends, a `fairserve gateway`
process started from a TOML file, streams from the official `openai` client. A reload while streams are in flight
and requests queued adds a backend (the queued requests go to it at once, its models are listed) and, later, removes
one (its streams in flight end whole, nothing is sent to it from the reload on, none is lost) and changes w_p/w_q (a
request that arrives after the reload is charged at the new price, one that arrived before keeps the old). The
gateway's usage log says where each request went and when it was dispatched."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime

import pytest
from openai import AsyncOpenAI
from support.gateway import ADMIN, HTTP, metric, wait_until
from support.processes import serve as serve_process

pytestmark = pytest.mark.integration

KEYS = {"alice": "key-alice", "bob": "key-bob"}
LIMIT, TOKENS = 4, 40  # requests in flight per backend; tokens per stream (about 1.5 s at --time-scale 1)
MS = 0.002  # the usage log's times are to the millisecond


def toml(usage: str, backends: list[str], extra: str = "") -> str:
    out = f'admin_key = "{ADMIN}"\nhealth_interval_s = 0.5\nusage_log = "{usage}"\n{extra}\n'
    for url in backends:
        out += f'[[backends]]\nurl = "{url}"\nmax_inflight_requests = {LIMIT}\n'
    for name, key in KEYS.items():
        out += f'[[tenants]]\nname = "{name}"\napi_keys = ["{key}"]\n'
    return out


async def stream(base: str, tenant: str, rid: str) -> tuple[int, str | None]:
    """A streamed chat request through the gateway: (content pieces received, the last finish_reason)."""
    async with AsyncOpenAI(base_url=base + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=60) as c:
        s = await c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=TOKENS,
            stream=True,
            extra_headers={"X-Request-Id": rid},
        )
        pieces, finish = 0, None
        async for chunk in s:
            if chunk.choices:
                pieces += bool(chunk.choices[0].delta.content)
                finish = chunk.choices[0].finish_reason or finish
        return pieces, finish


def reload(base: str) -> dict:
    r = HTTP.post(base + "/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    return r.json()


def usage(path) -> dict[str, dict]:
    """The usage log's lines by request id, each with `dispatched` (wall time, s) added."""
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["queue_wait_s"] is not None:
            end = datetime.fromisoformat(row["time"]).timestamp()
            row["dispatched"] = end - row["duration_s"] + row["queue_wait_s"]
        out[row["request_id"]] = row
    return out


def queued(base: str) -> float:
    return sum(metric(base, "fairserve_gateway_queue_length", tenant=t) for t in KEYS)


def inflight(base: str, backend: str) -> float:
    return metric(base, "fairserve_gateway_backend_inflight_requests", backend=backend)


def models(base: str) -> list[str]:
    doc = HTTP.get(base + "/v1/models", headers={"Authorization": f"Bearer {KEYS['alice']}"}).json()
    return sorted(m["id"] for m in doc["data"])


def test_a_reload_adds_a_backend_that_serves_at_once_and_drains_a_removed_one(tmp_path):
    log = tmp_path / "usage.jsonl"
    path = tmp_path / "gateway.toml"
    with (
        serve_process("emulate", "--model", "m", "--time-scale", "1") as a,
        serve_process("emulate", "--model", "m", "--model", "m2", "--time-scale", "1") as b,
    ):
        path.write_text(toml(str(log), [a]))
        with serve_process("gateway", "--config", str(path), "--no-access-log") as gw:
            assert models(gw) == ["m"]

            async def phase(ids: list[str], busy: dict[str, int], config: str, after: list[str] = ()):
                """`ids` streamed; once `busy` backends are full and the rest queued, `config` reloaded (and `after`
                sent once it is)."""
                sent = [asyncio.ensure_future(stream(gw, ("alice", "bob")[i % 2], rid)) for i, rid in enumerate(ids)]

                def loaded() -> bool:
                    full = all(inflight(gw, u) == n for u, n in busy.items())
                    return full and queued(gw) == len(ids) - sum(busy.values())

                assert await asyncio.to_thread(wait_until, loaded, 20)
                path.write_text(config)
                before = time.time()
                answer = await asyncio.to_thread(reload, gw)
                reloaded = time.time()
                later = [asyncio.ensure_future(stream(gw, "alice", rid)) for rid in after]
                return answer, (before, reloaded), await asyncio.gather(*sent, *later)

            # 1. add b while a's 4 streams run and 4 wait: the waiting ones go to b at once
            first = [f"add-{i}" for i in range(2 * LIMIT)]
            answer, (added_at, _), results = asyncio.run(phase(first, {a: LIMIT}, toml(str(log), [a, b])))
            assert answer["message"].endswith("2 backends (1 added, 0 removed, 0 changed)"), answer
            assert results == [(TOKENS, "length")] * len(first)  # every stream whole
            rows = usage(log)
            to_b = [r for r in (rows[i] for i in first) if r["backend"] == b]
            assert len(to_b) == LIMIT and all(r["dispatched"] > added_at - MS for r in to_b), rows
            assert models(gw) == ["m", "m2"]  # b's models are listed

            # 2. remove a (and charge w_p = 3, w_q = 5) while both run 4 streams and 4 wait
            second = [f"drain-{i}" for i in range(3 * LIMIT)]
            after = ["late-0", "late-1"]
            config = toml(str(log), [b], "w_p = 3.0\nw_q = 5.0")
            answer, (_, removed_at), results = asyncio.run(phase(second, {a: LIMIT, b: LIMIT}, config, after))
            assert f"1 backend (0 added, 1 removed, 0 changed; draining {LIMIT} requests" in answer["message"], answer
            assert results == [(TOKENS, "length")] * (len(second) + len(after))  # none lost, each whole
            rows = usage(log)
            on_a = [rows[i] for i in second if rows[i]["backend"] == a]
            assert len(on_a) == LIMIT  # a's streams in flight at the reload, and none after it
            assert all(r["dispatched"] < removed_at + MS for r in on_a), on_a
            assert all(r["outcome"] == "ok" and r["output_tokens"] == TOKENS for r in rows.values())
            for rid in second:  # arrived before the reload: the old price
                assert rows[rid]["service"] == rows[rid]["prompt_tokens"] + 2 * TOKENS
            for rid in after:  # after it: the new one
                assert rows[rid]["service"] == 3 * rows[rid]["prompt_tokens"] + 5 * TOKENS
            # a is dropped once drained: /healthz and /metrics name b alone
            assert wait_until(lambda: [x["url"] for x in HTTP.get(gw + "/healthz").json()["backends"]] == [b], 5)
            assert f'backend="{a}"' not in HTTP.get(gw + "/metrics").text
            assert models(gw) == ["m", "m2"]
