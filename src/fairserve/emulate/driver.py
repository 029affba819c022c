"""The real-time driver: one asyncio task runs a `SimEngine`, with simulated time following wall time × time_scale.

The engine's online contract is three calls: `submit(req)` (the request joins at the engine's clock), `advance_to(t)`
(every iteration of the router loop that starts before simulated time t; the engine moves from event to event, and
its clock ends at or past t, within the step in progress) and `cancel(req)` (charged the tokens produced by the
engine's clock). The driver calls `advance_to(now)` with the simulated time of the wall clock, sleeps until the wall
time of the engine's clock (scheduled against an absolute start, so there is no drift) and then hands every token
produced so far to its job.

Delivery: a token produced at simulated time s (the end of its decode step, or its prefill) is handed over at wall
time start + s / time_scale, never more than `MIN_SLEEP_S` (2 ms) before; after it by the event loop's own delay
while the driver keeps up (tests/test_emulate.py measures it). When the driver falls behind (a large time_scale, a
busy loop) it catches up without sleeping, every step due at once, yielding to the event loop every few
milliseconds. Everything runs on the event loop's thread, so the engine needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from starlette.requests import Request

from ..api.prefix import prefix_segments
from ..core import Ledger, RequestState, make_policy
from ..core.registry import split_options
from ..sim import Mode, SimEngine, SimRequest, engine_config, get_latency_model
from .config import EmulatorConfig, FaultDraw

log = logging.getLogger(__name__)

CLIENT_HEADER = "X-Fairserve-Client"  # names the engine-side client
POLL_S = 0.05  # how often a non-streaming or hung request checks that its client is still there
OUTCOMES = ("finished", "cancelled", "error", "dropped", "hung", "rejected")
MIN_SLEEP_S = 0.002  # a step due sooner than this is not slept for: tokens may come up to 2 ms early
YIELD_EVERY_S = 0.005  # while catching up, let the handlers run this often
KEEP_JOBS = 10_000  # `jobs` keeps this many of the most recent requests


class TooLarge(ValueError):
    """The request can never fit the engine (prompt + max_tokens vs the KV pool, or the prefill budget)."""


@dataclass(eq=False)
class Job:
    """One request as the HTTP handlers see it. `delivered` only grows, in step with the simulated clock."""

    req: SimRequest
    delivered: int = 0  # output tokens handed to the handler so far
    engine_done: bool = False  # the engine finished it (every token is delivered)
    outcome: str | None = None  # one of OUTCOMES, set once when the handler is done with it
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set on every delivery and on close

    @property
    def id(self) -> str:
        return str(self.req.id)

    @property
    def max_tokens(self) -> int:
        return self.req.output_tokens


class Emulator:
    """Holds the engine and the jobs; `app.state.emulator` in the app. Counters are for tests and /metrics."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        # NOTE: the preset's whole server (its pool, longer tokenized prompts, per-client admission reserve)
        policy, options = split_options(config.policy)  # engine options: the simulator's (docs/preemption.md)
        engine = engine_config(config.profile, config.kv_tokens, cast(Mode, config.engine_mode)).with_options(options)
        if config.prefix_cache:
            engine = replace(engine, prefix_cache=True, block_tokens=config.block_tokens)
        self.engine = SimEngine(Ledger(make_policy(policy)), get_latency_model(config.profile), engine)
        self.draw_fault = FaultDraw(config)
        self.jobs: dict[str, Job] = {}  # by request id, most recent KEEP_JOBS (finished ones too)
        self.outcomes: Counter[str] = Counter({o: 0 for o in OUTCOMES})
        self.cancelled = 0  # requests cancelled in the engine (disconnect, drop, hang)
        self.prompt_tokens_total = 0  # of prefilled requests (counted at their first token)
        self.prefix_queries = self.prefix_hits = 0  # prompt tokens looked up in the prefix cache, and found there
        self.generation_tokens_total = 0  # output tokens delivered
        self._live: dict[SimRequest, Job] = {}  # submitted, not yet finished or cancelled
        self._wake: asyncio.Event | None = None  # made in start(), on the serving loop
        self._start = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._start = time.monotonic() - self.engine.now / self.config.time_scale
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="fairserve-emulator")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for job in list(self._live.values()):
            self.close(job, "cancelled")

    def sim_now(self) -> float:
        """The simulated time that corresponds to the wall clock now."""
        return (time.monotonic() - self._start) * self.config.time_scale

    # ---- requests -----------------------------------------------------------------------------------------------
    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raises TooLarge, with the engine's own reason, for a request the emulated engine could never admit."""
        why = self.engine.too_large(prompt_tokens, max_tokens)
        if why is not None:
            raise TooLarge(why)

    def submit(
        self, id: str, client: str, prompt_tokens: int, max_tokens: int, prompt: str | Sequence[int] = ""
    ) -> Job:
        """A request arrives now. Its job's `req.state` is REJECTED if the policy refused it (rate limits).
        It joins the engine at its clock: the end of the step in progress, or, idle, the wall clock's time. With the
        prefix cache, `prompt` (its text or token ids) names its blocks (api/prefix.py)."""
        self.check_fits(prompt_tokens, max_tokens)
        eng = self.engine
        if not eng.running and not eng.ledger.num_queued:
            eng.idle_until(self.sim_now())  # NOTE: an idle engine's clock follows the wall clock
        req = SimRequest(
            id=id,
            tenant=client,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            output_tokens=max_tokens,
            arrival_s=eng.now,
        )
        if self.config.prefix_cache:
            req.prefix = prefix_segments(prompt, prompt_tokens, self.config.block_tokens)
        job = Job(req)
        self.jobs[job.id] = job
        if len(self.jobs) > KEEP_JOBS:
            del self.jobs[next(iter(self.jobs))]
        eng.submit(req)
        if req.state is not RequestState.REJECTED:
            self._live[req] = job
            if self._wake is not None:
                self._wake.set()
        return job

    def close(self, job: Job, outcome: str) -> None:
        """The handler is done with `job`: record its outcome (the first close wins) and, if the engine still has
        it, cancel it there. Safe to call more than once."""
        if job.outcome is not None:
            return
        job.outcome = outcome
        self.outcomes[outcome] += 1
        if self._live.pop(job.req, None) is not None and not job.req.done:
            self.engine.cancel(job.req)
            self.cancelled += 1
        job.changed.set()

    def count(self, outcome: str) -> None:
        """An outcome without a job (an injected error)."""
        self.outcomes[outcome] += 1

    def produced(self, id: str) -> int:
        """Output tokens the engine produced for request `id` (for a cancelled one: up to its cancellation)."""
        job = self.jobs[id]
        return job.req.generated_at(self.engine.step)

    # ---- the loop -----------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception:
            log.exception("the emulator's driver failed; requests in flight will not complete")
            raise

    async def _loop(self) -> None:
        eng, scale, wake = self.engine, self.config.time_scale, self._wake
        assert wake is not None
        yielded = time.monotonic()
        while True:
            if not eng.running and not eng.ledger.num_queued:
                wake.clear()
                await wake.wait()
                continue
            eng.advance_to(self.sim_now())
            wall = time.monotonic()
            delay = self._start + eng.now / scale - wall
            if delay > MIN_SLEEP_S:
                await asyncio.sleep(delay)
                yielded = time.monotonic()
            elif wall - yielded > YIELD_EVERY_S:
                await asyncio.sleep(0)
                yielded = time.monotonic()
            self._deliver()

    def _deliver(self) -> None:
        eng, live = self.engine, self._live
        for req in eng.running:
            job = live.get(req)
            if job is not None:
                self._hand(job, req.generated_at(eng.step))
        for req in eng.just_finished:
            job = live.pop(req, None)
            if job is not None:
                job.engine_done = True
                self._hand(job, req.generated)
                job.changed.set()

    def _hand(self, job: Job, produced: int) -> None:
        new = produced - job.delivered
        if new > 0:
            if job.delivered == 0:
                self.prompt_tokens_total += job.req.prompt_tokens
                if self.config.prefix_cache:
                    self.prefix_queries += job.req.prompt_tokens
                    self.prefix_hits += job.req.cached_tokens
            self.generation_tokens_total += new
            job.delivered = produced
            job.changed.set()


async def wait_tokens(job: Job, request: Request, target: int) -> bool:
    """Wait until `target` tokens are delivered (or the engine is done); False if the client went away."""
    next_check = time.monotonic() + POLL_S
    while job.delivered < target and not job.engine_done:
        job.changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(POLL_S):  # NOTE: asyncio.wait_for on 3.11 can drop a cancel
                await job.changed.wait()
        if time.monotonic() >= next_check:
            if await request.is_disconnected():
                return False
            next_check = time.monotonic() + POLL_S
    return True
