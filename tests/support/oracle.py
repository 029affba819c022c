"""The step-by-step engine: the simulator's loop as it was, one decode step per iteration, kept as the oracle that
`fairserve.sim.SimEngine` (event-driven) must equal bit for bit: every record, every charge. It re-tries admission
every step after the wait, charges every running request before each decision and rebuilds the reserve index after
every change; its clock adds each step's ticks in turn (sim/ticks.py: a step's duration rounded to whole ticks of
2^-64 s); nothing here is fast, everything is plain. Its admission checks and prefix cache are in `oracle_fits.py`.

Online use (as the emulator drives the engine): `submit` at the engine's clock, `advance_to(t)` runs whole
iterations until the clock reaches t (it may end past t, by at most one step), `cancel` charges what was produced by
the clock. `SimEngine` has the same three calls with the same meaning.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from fairserve.core.ledger import Ledger
from fairserve.core.request import RequestState
from fairserve.sim.latency import LatencyModel, decode_lines, prefill_cached_s
from fairserve.sim.prefix_cache import prompt_keys
from fairserve.sim.requests import EngineConfig, SimRequest, SimResult, record_of, sim_requests, too_large
from fairserve.sim.ticks import FOREVER, at_or_after, seconds, step_ticks, ticks

from .oracle_fits import CachedFits, CapFits, Index, PagedFits, PlainCache, ReserveFits

RUNNING = RequestState.RUNNING


class StepEngine:
    def __init__(
        self,
        ledger: Ledger,
        latency: LatencyModel,
        config: EngineConfig | None = None,
        observer: Callable[[StepEngine], None] | None = None,
    ) -> None:
        self.ledger, self.latency, self.config, self.observer = ledger, latency, config or EngineConfig(), observer
        self.t, self.step, self.kv_used, self.busy = 0, 0, 0, 0  # the clock and the busy time in ticks
        self.extra = self.config.prompt_extra_tokens
        self.running: dict[SimRequest, None] = {}
        self.ends: list[tuple[int, int, SimRequest]] = []
        self.index: Index | None = None  # reserve mode, for the running set as it is
        self.prefills = self.preemptions = self.waited = self.fair_preemptions = 0
        self.eager = ledger.policy.capabilities.orders_by_counter
        self.just_finished: list[SimRequest] = []
        cfg = self.config
        self.cache = PlainCache(cfg.kv_tokens // cfg.block_tokens, cfg.block_tokens) if cfg.prefix_cache else None
        if ledger.policy.capabilities.uses_prefix_cache:
            assert self.cache is not None
            ledger.policy.cached = self.cached

    @property
    def now(self) -> float:
        return seconds(self.t)

    @property
    def busy_s(self) -> float:
        return seconds(self.busy)

    def keys(self, r: SimRequest, tokens: int | None = None) -> list:
        """The keys of the full blocks of its first `tokens` tokens (default: what its prefill fills)."""
        assert self.cache is not None
        n = r.prompt_tokens + self.extra + r.generated if tokens is None else tokens
        own = ("own", r.id) if r.continued_as is None else r.continued_as  # a later prompt's segment, if any
        return prompt_keys(n, self.cache.block_tokens, own, r.prefix)

    def cached(self, r) -> int:
        assert self.cache is not None
        return self.cache.hit(self.keys(r), r.prompt_tokens + self.extra + r.generated) * self.cache.block_tokens

    def release(self, r: SimRequest) -> None:
        if r.held is not None:
            assert self.cache is not None
            self.cache.release(r.held, self.keys(r, r.prompt_tokens + self.extra + r.generated - 1))
            r.held = None

    def run(self, arrivals: Iterable, until_s: float | None = None) -> SimResult:
        reqs = sim_requests(arrivals)
        n, i = len(reqs), 0
        horizon = None if until_s is None else at_or_after(until_s)
        while True:
            while i < n and at_or_after(reqs[i].arrival_s) <= self.t:
                self.submit(reqs[i])
                i += 1
            if horizon is not None and self.t >= horizon:
                break
            if not self.advance():
                if i == n:
                    break
                self.t = max(self.t, at_or_after(reqs[i].arrival_s))
                if horizon is not None:
                    self.t = min(self.t, horizon)
        self._sync()
        records = [record_of(r, self.step, self.now) for r in reqs]
        return SimResult(
            records,
            self.ledger,
            self.now,
            self.step,
            self.prefills,
            self.preemptions,
            self.busy_s,
            self.config,
            self.fair_preemptions,
            [r.cached_tokens for r in reqs] if self.cache is not None else None,
        )

    # ---- online ---------------------------------------------------------------------------------------------------
    def advance_to(self, t: float) -> None:
        finished: list[SimRequest] = []
        until = at_or_after(t)
        while self.t < until:
            busy = self.advance()
            finished += self.just_finished
            if not busy:
                if until != FOREVER:
                    self.t = until
                break
        self.just_finished = finished

    def submit(self, req: SimRequest) -> None:
        if too_large(self.config, req.prompt_tokens, req.output_tokens) is not None:
            req.state = RequestState.REJECTED
            return
        if self.eager and self.running:
            self._sync()
        self.ledger.add(req, now=req.arrival_s)

    def cancel(self, req: SimRequest) -> None:
        if req.state is RUNNING:
            req.generated = req.generated_at(self.step)
            self.index = None
            del self.running[req]
            self.release(req)
            self.kv_used -= req.prompt_tokens + self.extra + req.generated
            self.ledger.output(req, req.generated - req.output_done)
        self.ledger.settle(req, cancelled=True)

    # ---- the loop -------------------------------------------------------------------------------------------------
    def advance(self) -> bool:
        self.just_finished = []
        if not self.running:
            if self.ledger.num_queued == 0:
                return False
            self.waited = 0
            if not self.admit():
                raise RuntimeError("nothing fits an empty engine")
            return True
        if self.waited >= self.config.wait_steps and self.ledger.num_queued and self.admit():
            self.waited = 0
            return True
        self.decode()
        self.waited += 1
        return True

    def fits(self, running: list[SimRequest] | None = None) -> ReserveFits | PagedFits | CapFits | CachedFits:
        if self.cache is not None:
            return CachedFits(self)
        fits = ReserveFits(self, running) if self.config.mode == "reserve" else PagedFits(self, running)
        return fits if self.config.running_cap is None else CapFits(self, fits)

    def admit(self) -> bool:
        admitted = self.admit_round()
        cfg = self.config
        while (cfg.preempt_delta is not None or cfg.preempt_priority) and self.ledger.num_queued and self.running:
            if self.eager:
                self._sync()
            if not (cfg.preempt_priority and self.priority_preempt()) and not (
                cfg.preempt_delta is not None and self.fair_preempt()
            ):
                break
            admitted = self.admit_round() or admitted
        return admitted

    def priority_preempt(self) -> bool:
        """Plainly: the running requests of a level worse than the next request's, not preempted too often; the
        worst level first, then the highest counter, then the newest; the shortest prefix of them whose removal lets
        the next request fit is preempted (none if all of them would not do)."""
        head = self.ledger.peek()
        assert head is not None
        counter = {t: a.counter for t, a in self.ledger.accounts.items()}
        mine = head.priority or 0
        newest_first = list(self.running)[::-1]
        candidates = [
            r for r in newest_first if (r.priority or 0) > mine and r.fair_preemptions < self.config.preempt_max
        ]
        candidates = sorted(candidates, key=lambda r: (-(r.priority or 0), -counter[r.tenant]))
        for n in range(1, len(candidates) + 1):
            gone = candidates[:n]
            if self.fits([r for r in self.running if r not in gone])(head):  # type: ignore[arg-type]
                for r in gone:
                    r.fair_preemptions += 1
                    self.fair_preemptions += 1
                    self.preempt(r)
                return True
        return False

    def admit_round(self) -> bool:
        if self.eager:
            self._sync()
        fits = self.fits()
        if isinstance(fits, CachedFits):  # blocks taken after each pop (CachedFits.take)
            batch: list[SimRequest] = []
            while (req := self.ledger.peek()) is not None and fits(req):  # type: ignore[arg-type]
                if not req.admitted:
                    req.cached_tokens = self.cached(req)  # charged at admission
                self.ledger.pop()
                fits.take(req)  # type: ignore[arg-type]
                batch.append(req)  # type: ignore[arg-type]
        else:
            batch = self.ledger.admit(fits)  # type: ignore[arg-type, assignment]
        if batch:
            self.prefill(batch)
        return bool(batch)

    def fair_preempt(self) -> bool:
        """Plainly: the tenants whose counter is more than DELTA above the next request's tenant's, highest first;
        their requests not preempted too often, newest first; the shortest prefix of them whose removal lets the
        next request fit is preempted (none if all of them would not do)."""
        head = self.ledger.peek()
        assert head is not None
        counter = {t: a.counter for t, a in self.ledger.accounts.items()}
        over = counter[head.tenant] + self.config.preempt_delta
        newest_first = list(self.running)[::-1]
        candidates = [
            r
            for r in newest_first
            if r.tenant != head.tenant and counter[r.tenant] > over and r.fair_preemptions < self.config.preempt_max
        ]
        candidates = sorted(candidates, key=lambda r: -counter[r.tenant])
        for n in range(1, len(candidates) + 1):
            gone = candidates[:n]
            if self.fits([r for r in self.running if r not in gone])(head):  # type: ignore[arg-type]
                for r in gone:
                    r.fair_preemptions += 1
                    self.fair_preemptions += 1
                    self.preempt(r)
                return True
        return False

    def prefill(self, batch: list[SimRequest]) -> None:
        start = self.now
        lens = [r.prompt_tokens + self.extra + r.generated for r in batch]
        if self.cache is None:
            dt = ticks(self.latency.prefill_s(lens))
        else:
            cached = [r.held.cached_tokens for r in batch]
            dt = ticks(prefill_cached_s(self.latency, [n - c for n, c in zip(lens, cached, strict=True)], cached))
        self.t += dt
        self.busy += dt
        self.prefills += 1
        for r in batch:
            if r.admit_s is None:
                r.admit_s = start
            if r.first_token_s is None:
                r.first_token_s = self.now
            r.generated += 1
            r.step_base = self.step
            self.kv_used += r.prompt_tokens + self.extra + r.generated
            self.running[r] = None
            r.end_step = self.step + r.output_tokens - r.generated
            if r.end_step == self.step:
                self.finish(r)
            else:
                heapq.heappush(self.ends, (r.end_step, r.seq, r))
        self.index = None
        if self.observer:
            self.observer(self)

    def decode(self) -> None:
        if self.cache is not None:
            size, step = self.cache.block_tokens, self.step
            while self.running:  # the KV of every request's input token (its last sampled) goes in a new block?
                due = [r for r in self.running if (r.prompt_tokens + self.extra + r.generated_at(step) - 1) % size == 0]
                if len(due) <= self.cache.available():
                    for r in due:
                        self.cache.grow(r.held)
                    break
                self.preempt(next(reversed(self.running)))
            if not self.running:
                return
        elif self.config.mode == "paged":
            while self.kv_used + len(self.running) > self.config.kv_tokens:
                self.preempt(next(reversed(self.running)))
            if not self.running:
                return
        n = len(self.running)
        lines = decode_lines(self.latency, n)
        dt = (
            step_ticks(lines, self.kv_used) if lines is not None else ticks(self.latency.decode_step_s(n, self.kv_used))
        )
        self.t += dt
        self.busy += dt
        self.step += 1
        self.kv_used += n
        while self.ends and self.ends[0][0] <= self.step:
            r = heapq.heappop(self.ends)[2]
            if r.state is RUNNING:
                r.generated = r.generated_at(self.step)
                self.finish(r)
        if self.observer:
            self.observer(self)

    def finish(self, r: SimRequest) -> None:
        self.index = None
        del self.running[r]
        self.release(r)
        self.kv_used -= r.prompt_tokens + self.extra + r.generated
        r.finish_s = r.last_token_s = self.now
        self.ledger.output(r, r.generated - r.output_done)
        self.ledger.settle(r)
        self.just_finished.append(r)

    def preempt(self, r: SimRequest) -> None:
        r.generated = r.generated_at(self.step)
        self.index = None
        del self.running[r]
        self.release(r)
        self.kv_used -= r.prompt_tokens + self.extra + r.generated
        self.ends = [e for e in self.ends if e[2] is not r]
        heapq.heapify(self.ends)
        self.ledger.output(r, r.generated - r.output_done)
        self.ledger.requeue(r)
        self.preemptions += 1

    def _sync(self) -> None:
        for r in self.running:
            n = r.generated + self.step - r.step_base - r.output_done
            if n:
                self.ledger.output(r, n)
