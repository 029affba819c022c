"""The step-by-step engine: the simulator's loop as it was, one decode step per iteration, kept as the oracle that
`fairserve.sim.SimEngine` (event-driven) must equal bit for bit: every record, every charge. It re-tries admission
every step after the wait, charges every running request before each decision and rebuilds the reserve index after
every change; nothing here is fast, everything is plain.

Online use (as the emulator drives the engine): `submit` at the engine's clock, `advance_to(t)` runs whole
iterations until the clock reaches t (it may end past t, by at most one step), `cancel` charges what was produced by
the clock. `SimEngine` has the same three calls with the same meaning.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Iterable

from fairserve.core.ledger import Ledger
from fairserve.core.request import RequestState
from fairserve.sim.latency import LatencyModel
from fairserve.sim.requests import EngineConfig, SimRequest, SimResult, record_of, sim_requests, too_large

RUNNING = RequestState.RUNNING


class Index:
    """LightLLM's reserve check for the running batch plus candidates: prefix/suffix maxima over the requests
    sorted by end step (most to go first), built from scratch for every running set (see sim/budget.py)."""

    def __init__(self, running: list[tuple[int, int]]) -> None:
        self.ends = sorted(running, key=lambda e: -e[0])
        self.neg_e = [-e for e, _ in self.ends]
        self.cum, self.prefix = [0], [0]
        for i, (e, t) in enumerate(self.ends, 1):
            self.cum.append(self.cum[-1] + t - e)
            self.prefix.append(max(self.prefix[-1], (e - 1) * i + self.cum[i]))
        n = len(self.ends)
        self.suffix = [float("-inf")] * (n + 2)
        for i in range(n, 0, -1):
            self.suffix[i] = max(self.suffix[i + 1], (self.ends[i - 1][0] - 1) * (i + 1) + self.cum[i])

    def peak_with(self, held: int, left: int, step: int) -> float:
        pos = bisect_right(self.neg_e, -(left + step + 1))
        own = left * (pos + 1) + self.cum[pos] + pos * step + held
        return max(self.prefix[pos], own, self.suffix[pos + 1] - step + held)


class ReserveFits:
    def __init__(self, engine: StepEngine, running: list[SimRequest] | None = None) -> None:
        cfg, self.extra, self.step = engine.config, engine.extra, engine.step
        entries = [
            (r.end_step, r.prompt_tokens + self.extra + r.output_tokens)
            for r in (engine.running if running is None else running)
        ]
        if running is not None:
            self.index = Index(entries)
        else:
            if engine.index is None:  # NOTE: cached while the running set stays the same, as the engine always did
                engine.index = Index(entries)
            self.index = engine.index
        self.kv, self.prefill_left, self.running_max, self.per_client = (
            cfg.kv_tokens,
            cfg.prefill_tokens,
            cfg.running_max,
            cfg.reserve_per_client_tokens,
        )
        self.clients = {r.tenant for r in (engine.running if running is None else running)}

    def __call__(self, req: SimRequest) -> bool:
        need = req.prompt_tokens + self.extra + req.generated
        if need > self.prefill_left or len(self.index.ends) + 1 > self.running_max:
            return False
        held, left = need + 1, req.output_tokens - req.generated - 1
        adapters = len(self.clients) + (req.tenant not in self.clients)
        if self.index.peak_with(held, left, self.step) >= self.kv - self.per_client * adapters:
            return False
        e = self.step + left + 1
        self.index = Index([*self.index.ends, (e, held + e - self.step)])
        self.prefill_left -= need
        self.clients.add(req.tenant)
        return True


class PagedFits:
    def __init__(self, engine: StepEngine, running: list[SimRequest] | None = None) -> None:
        cfg, self.extra = engine.config, engine.extra
        used = engine.kv_used  # the running requests' prompts and generated tokens
        if running is not None:
            used = sum(r.prompt_tokens + self.extra + r.generated_at(engine.step) for r in running)
        self.free, self.prefill_left = cfg.kv_tokens - used, cfg.prefill_tokens
        self.slots = cfg.running_max - len(engine.running if running is None else running)

    def __call__(self, req: SimRequest) -> bool:
        need = req.prompt_tokens + self.extra + req.generated
        if need > self.prefill_left or need + 1 > self.free or self.slots < 1:
            return False
        self.free -= need + 1
        self.prefill_left -= need
        self.slots -= 1
        return True


class CapFits:
    """The per-tenant cap on reserved running memory (prompt + max_tokens), in front of the pool's check."""

    def __init__(self, engine: StepEngine, inner: ReserveFits | PagedFits) -> None:
        self.inner, self.cap, self.extra = inner, engine.config.running_cap, engine.extra
        self.held: dict[str, int] = {}
        for r in engine.running:
            self.held[r.tenant] = self.held.get(r.tenant, 0) + r.prompt_tokens + self.extra + r.output_tokens

    def __call__(self, req: SimRequest) -> bool:
        held, tokens = self.held.get(req.tenant, 0), req.prompt_tokens + self.extra + req.output_tokens
        if self.cap is not None and held and held + tokens > self.cap:
            return False
        if not self.inner(req):
            return False
        self.held[req.tenant] = held + tokens
        return True


class StepEngine:
    def __init__(
        self,
        ledger: Ledger,
        latency: LatencyModel,
        config: EngineConfig | None = None,
        observer: Callable[[StepEngine], None] | None = None,
    ) -> None:
        self.ledger, self.latency, self.config, self.observer = ledger, latency, config or EngineConfig(), observer
        self.now, self.step, self.kv_used, self.busy_s = 0.0, 0, 0, 0.0
        self.extra = self.config.prompt_extra_tokens
        self.running: dict[SimRequest, None] = {}
        self.ends: list[tuple[int, int, SimRequest]] = []
        self.index: Index | None = None  # reserve mode, for the running set as it is
        self.prefills = self.preemptions = self.waited = self.fair_preemptions = 0
        self.eager = ledger.policy.capabilities.orders_by_counter
        self.just_finished: list[SimRequest] = []

    def run(self, arrivals: Iterable, until_s: float | None = None) -> SimResult:
        reqs = sim_requests(arrivals)
        n, i = len(reqs), 0
        horizon = float("inf") if until_s is None else until_s
        while True:
            while i < n and reqs[i].arrival_s <= self.now:
                self.submit(reqs[i])
                i += 1
            if self.now >= horizon:
                break
            if not self.advance():
                if i == n:
                    break
                self.now = min(max(self.now, reqs[i].arrival_s), horizon)
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
        )

    # ---- online ---------------------------------------------------------------------------------------------------
    def advance_to(self, t: float) -> None:
        finished: list[SimRequest] = []
        while self.now < t:
            busy = self.advance()
            finished += self.just_finished
            if not busy:
                self.now = t
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

    def fits(self, running: list[SimRequest] | None = None) -> ReserveFits | PagedFits | CapFits:
        fits = ReserveFits(self, running) if self.config.mode == "reserve" else PagedFits(self, running)
        return fits if self.config.running_cap is None else CapFits(self, fits)

    def admit(self) -> bool:
        admitted = self.admit_round()
        while self.config.preempt_delta is not None and self.ledger.num_queued and self.running:
            if self.eager:
                self._sync()
            if not self.fair_preempt():
                break
            admitted = self.admit_round() or admitted
        return admitted

    def admit_round(self) -> bool:
        if self.eager:
            self._sync()
        batch: list[SimRequest] = self.ledger.admit(self.fits())  # type: ignore[arg-type, assignment]
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
        dt = self.latency.prefill_s([r.prompt_tokens + self.extra + r.generated for r in batch])
        self.now += dt
        self.busy_s += dt
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
        if self.config.mode == "paged":
            while self.kv_used + len(self.running) > self.config.kv_tokens:
                self.preempt(next(reversed(self.running)))
            if not self.running:
                return
        n = len(self.running)
        dt = self.latency.decode_step_s(n, self.kv_used)
        self.now += dt
        self.busy_s += dt
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
        self.kv_used -= r.prompt_tokens + self.extra + r.generated
        r.finish_s = r.last_token_s = self.now
        self.ledger.output(r, r.generated - r.output_done)
        self.ledger.settle(r)
        self.just_finished.append(r)

    def preempt(self, r: SimRequest) -> None:
        r.generated = r.generated_at(self.step)
        self.index = None
        del self.running[r]
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
