"""Replay arrivals against an OpenAI-compatible streaming endpoint and record what each client observed.

Every arrival is sent at wall time `arrival_s / time_scale` after the start as one streaming request, and every
time in the records is in *workload* seconds (wall seconds since the start × time_scale), so the metrics compare
with the simulator's. What is not observable from outside the server is approximated:

- admit_s (start of the prefill) is taken to be first_token_s;
- arrival_s is the scheduled time (dispatch is late by at most a few milliseconds of event-loop lag).

Status: "finished" (saw `[DONE]`, or a finish_reason before a clean end); "rejected" (an HTTP error status before
any streaming, or no connection at all: the request was never accepted); "unfinished" (the stream was cut, ended
early, reported an error event, or ran past `timeout_s` wall seconds; or the server answered that it timed out in
its queue, `queue_timeout`: it waited and was never served).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from ..api.prefix import prompt_text
from ..api.tokens import prompt_of
from ..records import RequestRecord
from ..workloads import Arrival

ENDPOINTS = ("completions", "chat")
DEFAULT_MODEL = "fairserve-emulated"
DEFAULT_TIMEOUT_S = 600.0
CLIENT_HEADER = "X-Fairserve-Client"
XARGS_CLIENT_KEY = "fairserve_client"  # what fairserve.engines.vllm_scheduler reads by default
_MAX_CONNECTIONS = 4096


@dataclass(slots=True)
class BenchRecord(RequestRecord):
    """A RequestRecord plus what only a benchmark sees; `to_dict()` includes both extra fields."""

    http_status: int | None = None  # None: no HTTP answer (connection failed)
    error: str | None = None  # one line, for anything but a clean finish


class _StreamError(Exception):
    """The server sent an error event in the middle of the stream."""


def resolve_keys(keys: Mapping[str, str], clients: Iterable[str]) -> dict[str, str]:
    """The API key of every client; `*` is the default for clients not listed. ValueError names the keyless."""
    names = set(clients)
    default = keys.get("*")
    missing = sorted(c for c in names if c not in keys and default is None)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ValueError(f"no API key for client(s) {shown}; add CLIENT=KEY to --keys or a default *=KEY")
    return {c: keys.get(c, default or "") for c in names}


def preflight(
    urls: Sequence[str], key_of: Mapping[str, str], placement: Mapping[str, str], wait_s: float = 0.0
) -> list[str]:
    """Before a run: each target answers `GET /v1/models` with every key sent to it; returns the model ids the first
    target lists. ValueError with one line when a target cannot be reached (within `wait_s` seconds, to let a server
    just started come up) or refuses a key (401, 403): a run against it would only count failures."""
    models: list[str] = []
    deadline = time.monotonic() + wait_s
    with httpx.Client(timeout=5.0) as client:
        for url in dict.fromkeys(urls):
            base = url.rsplit("/v1/", 1)[0]
            for name, key in {c: k for c, k in key_of.items() if placement.get(c, url) == url}.items():
                while True:
                    try:
                        r = client.get(base + "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {})
                        break
                    except httpx.HTTPError as e:
                        if time.monotonic() >= deadline:
                            raise ValueError(
                                f"cannot reach the target {base}: {_one_line(str(e)) or type(e).__name__}"
                            ) from None
                        time.sleep(0.2)
                if r.status_code in (401, 403):
                    raise ValueError(
                        f"the target {base} refused the API key of client {name!r} (HTTP {r.status_code}); check --keys"
                    )
                if not models and r.status_code == 200:
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        models = [str(m["id"]) for m in r.json()["data"]]
    return models


def endpoint_url(target: str, endpoint: str) -> str:
    """`http://host:port` or `http://host:port/v1` → the completions or chat completions URL."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {endpoint!r}; expected one of: {', '.join(ENDPOINTS)}")
    base = target.strip().rstrip("/")
    if not base.startswith(("http://", "https://")) or len(base.split("//", 1)[1]) == 0:
        raise ValueError(f"bad target {target!r}: expected an http(s) URL such as http://127.0.0.1:8000")
    if not base.endswith("/v1"):
        base += "/v1"
    return base + ("/completions" if endpoint == "completions" else "/chat/completions")


def request_body(a: Arrival, endpoint: str, model: str, xargs_key: str | None = None) -> dict:
    """The streaming request for `a`. With `xargs_key`, the client also goes in the body as
    `"vllm_xargs": {xargs_key: client}`: vLLM passes that to its scheduler, and it sees no API key."""
    body: dict = {
        "model": model,
        "max_tokens": a.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if xargs_key:
        body["vllm_xargs"] = {xargs_key: a.client}
    # NOTE: a workload that declares prefixes gets text that shares exactly them (a server's prefix cache sees them)
    text = prompt_text(a.prompt_tokens, a.prefix, (a.client, a.arrival_s)) if a.prefix else prompt_of(a.prompt_tokens)
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def default_connections(n_requests: int) -> int:
    """Enough connections that the server, not the client, queues requests; capped below the open-file limit."""
    cap = _MAX_CONNECTIONS
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY:
            cap = min(cap, max(16, soft - 64))
    return max(1, min(n_requests, cap))


class _Progress:
    """What one stream has shown so far, in workload seconds."""

    def __init__(self) -> None:
        self.first: float | None = None  # first content chunk
        self.first_any: float | None = None  # first chunk with choices, even without text
        self.last: float | None = None
        self.chunks = 0
        self.usage: dict | None = None
        self.finish_reason: str | None = None
        self.done = False

    def feed(self, line: str, now: float) -> None:
        """One SSE line; sets `done` on `data: [DONE]`."""
        if not line.startswith("data:"):
            return  # blank separators, comments, `event:` lines
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        if obj.get("error"):
            err = obj["error"]
            raise _StreamError(str(err.get("message", err) if isinstance(err, dict) else err))
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            self.first_any = self.first_any if self.first_any is not None else now
            text = choice.get("text")
            if text is None:
                text = (choice.get("delta") or {}).get("content")
            if text:
                self.chunks += 1
                self.first = self.first if self.first is not None else now
                self.last = now
            self.finish_reason = choice.get("finish_reason") or self.finish_reason


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


WAITED_CODES = frozenset({"queue_timeout"})  # error codes of a request that waited in the queue and was not served


def _error_code(body: bytes) -> str | None:
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None


def _error_message(body: bytes) -> str:
    try:
        err = json.loads(body).get("error")
        return _one_line(str(err.get("message", err) if isinstance(err, dict) else err))
    except (ValueError, AttributeError):
        return _one_line(body.decode("utf-8", "replace")) or "(empty body)"


async def _send(
    client: httpx.AsyncClient,
    url: str,
    idx: int,
    a: Arrival,
    key: str,
    endpoint: str,
    model: str,
    clock: Callable[[], float],
    timeout_s: float,
    gate: asyncio.Semaphore | None,
    xargs_key: str | None = None,
) -> BenchRecord:
    p = _Progress()
    status = "unfinished"
    http_status: int | None = None
    error: str | None = None
    end: float | None = None
    headers = {"Authorization": f"Bearer {key}", CLIENT_HEADER: a.client}
    async with gate or contextlib.nullcontext():
        try:
            async with asyncio.timeout(timeout_s):
                async with client.stream(
                    "POST", url, json=request_body(a, endpoint, model, xargs_key), headers=headers
                ) as r:
                    http_status = r.status_code
                    if r.status_code >= 400:
                        body = await r.aread()
                        # NOTE: a request that timed out in the server's queue waited: unfinished, not rejected
                        status = "unfinished" if _error_code(body) in WAITED_CODES else "rejected"
                        error = f"HTTP {r.status_code}: {_error_message(body)}"
                    else:
                        async for line in r.aiter_lines():
                            p.feed(line, clock())
                            if p.done:
                                break
                        end = clock()
                        if p.done or p.finish_reason:
                            status = "finished"
                        else:
                            error = "stream ended without [DONE]"
        except TimeoutError:
            error = f"timed out after {timeout_s:g} s (wall)"
        except _StreamError as e:
            error = _one_line(f"error event: {e}")
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            status, error = "rejected", _one_line(f"could not connect: {e}")
        except httpx.HTTPError as e:
            error = _one_line(f"{type(e).__name__}: {e}")
    usage = p.usage or {}
    reported_out, reported_prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
    out = reported_out if isinstance(reported_out, int) else p.chunks
    prompt = reported_prompt if isinstance(reported_prompt, int) else a.prompt_tokens
    finish = end if status == "finished" else None
    first = p.first
    if first is None and finish is not None:  # finished without text: take the first chunk as its first token
        first = p.first_any if p.first_any is not None else finish
    last = finish if finish is not None else p.last
    return BenchRecord(
        id=idx,
        client=a.client,
        arrival_s=a.arrival_s,
        admit_s=first,
        first_token_s=first,
        finish_s=finish,
        last_token_s=last if first is not None else None,
        prompt_tokens=prompt,
        output_tokens=out,
        max_tokens=a.output_tokens,
        status=status,
        http_status=http_status,
        error=error,
    )


def _check(arrivals: Sequence[Arrival], time_scale: float, timeout_s: float, max_inflight: int | None) -> None:
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if max_inflight is not None and max_inflight < 1:
        raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
    if not arrivals:
        raise ValueError("no requests to send")


PLACEMENTS = ("round-robin", "by-client")


def place(targets: str, arrivals: Sequence[Arrival], endpoint: str, placement: str = "round-robin") -> list[str]:
    """The endpoint URL each arrival goes to. `targets` is one base URL or a comma-separated list (several
    gateway replicas): round-robin over arrivals in time order, or by-client (each client pinned to one target,
    clients dealt out in sorted order)."""
    urls = [endpoint_url(t, endpoint) for t in targets.split(",") if t.strip()]
    if not urls:
        raise ValueError(f"bad target {targets!r}: expected one or more comma-separated http(s) URLs")
    if placement not in PLACEMENTS:
        raise ValueError(f"bad placement {placement!r}: expected one of {', '.join(PLACEMENTS)}")
    if placement == "by-client":
        pin = {c: urls[k % len(urls)] for k, c in enumerate(sorted({a.client for a in arrivals}))}
        return [pin[a.client] for a in arrivals]
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].arrival_s)
    out = [""] * len(arrivals)
    for k, i in enumerate(order):
        out[i] = urls[k % len(urls)]
    return out


async def run_bench_async(
    target: str,
    arrivals: Sequence[Arrival],
    keys: Mapping[str, str],
    *,
    time_scale: float = 1.0,
    endpoint: str = "completions",
    model: str = DEFAULT_MODEL,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_inflight: int | None = None,
    xargs_key: str | None = None,
    placement: str = "round-robin",
    progress: Callable[[BenchRecord], None] | None = None,
) -> list[BenchRecord]:
    """Send every arrival on time and wait for all of them; records come back in the order of `arrivals`
    (`id` = index). `max_inflight` caps concurrent requests: later ones wait in the client, which counts in their
    response time. `xargs_key` also names the client in each body's `vllm_xargs`. `progress` is called with each
    record as its request ends. Validation (keys, URL, numbers) raises ValueError before anything is sent."""
    _check(arrivals, time_scale, timeout_s, max_inflight)
    key_of = resolve_keys(keys, (a.client for a in arrivals))
    url_of = place(target, arrivals, endpoint, placement)
    conns = default_connections(max_inflight or len(arrivals))
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    timeouts = httpx.Timeout(30.0, read=None, pool=None)  # the whole request is bounded by timeout_s instead
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].arrival_s)
    gate = asyncio.Semaphore(max_inflight) if max_inflight else None
    async with httpx.AsyncClient(limits=limits, timeout=timeouts) as client:
        loop = asyncio.get_running_loop()
        start = loop.time()

        def clock() -> float:
            return (loop.time() - start) * time_scale

        tasks: dict[int, asyncio.Task[BenchRecord]] = {}
        async with asyncio.TaskGroup() as tg:  # on error or cancellation, every request task is cancelled
            for i in order:
                a = arrivals[i]
                delay = start + a.arrival_s / time_scale - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks[i] = tg.create_task(
                    _send(client, url_of[i], i, a, key_of[a.client], endpoint, model, clock, timeout_s, gate, xargs_key)
                )
                if progress is not None:
                    tasks[i].add_done_callback(lambda t: t.cancelled() or t.exception() or progress(t.result()))
    return [tasks[i].result() for i in range(len(arrivals))]


def run_bench(
    target: str,
    arrivals: Sequence[Arrival],
    keys: Mapping[str, str],
    *,
    time_scale: float = 1.0,
    endpoint: str = "completions",
    model: str = DEFAULT_MODEL,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_inflight: int | None = None,
    xargs_key: str | None = None,
    placement: str = "round-robin",
    progress: Callable[[BenchRecord], None] | None = None,
) -> list[BenchRecord]:
    """Synchronous `run_bench_async` (its own event loop; not for use inside a running loop)."""
    return asyncio.run(
        run_bench_async(
            target,
            arrivals,
            keys,
            time_scale=time_scale,
            endpoint=endpoint,
            model=model,
            timeout_s=timeout_s,
            max_inflight=max_inflight,
            xargs_key=xargs_key,
            placement=placement,
            progress=progress,
        )
    )
