"""A discrete-event simulation of one continuous-batching LLM server driving a fairserve policy.

The loop is the S-LoRA / LightLLM router's: with nothing running, admit a batch and prefill it; otherwise decode up
to `max_wait_steps` steps, then try to admit a mini-batch (prefill and merge it), and keep decoding if nothing fits.
Time advances by the latency model's prefill and decode-step durations; arrivals join the policy at step boundaries
(with their true arrival time).

The engine moves from event to event: arrivals, admissions, finishes, preemptions. Between two events the batch does
not change, so a run of decode steps is one move: time is whole ticks (sim/ticks.py), and the run's ticks have a
closed form that is the sum the step-by-step loop adds (sim/clock.py); the next finish is the top of a heap; the next
step at which an admission could succeed is computed instead of tried step by step (`_next_try`); charges are made
when a decision reads the counters, not at every step. The records are the step-by-step loop's, bit for bit
(tests/support/oracle.py keeps that loop as the oracle).
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable, Iterable

from ..core.account import SEP
from ..core.ledger import Ledger
from ..core.policy import Policy
from ..core.request import Request, RequestState
from .budget import PagedBudget, ReserveBudget, ReserveIndex
from .cached import PrefixCaching
from .clock import DecodeClock
from .forecast import NEVER, Charging, Forecast, QueuedSizes, exact_charges
from .latency import LatencyModel, prefill_cached_s
from .preempt import Capped, Preemption
from .requests import EngineConfig, SimRequest, SimResult, record_of, sim_requests, too_large
from .ticks import FOREVER, at_or_after, ticks

RUNNING, QUEUED = RequestState.RUNNING, RequestState.QUEUED
LOOKAHEAD = 16  # a decode run goes past at most this many arrivals that need no step of their own (`_cut`)


class SimEngine(Forecast, DecodeClock, Preemption, PrefixCaching):
    """Drives a ledger (and so its policy) with the arrivals of a workload. One instance runs one simulation.

    Offline, `run(arrivals)`. Online (the emulator): `submit(req)` at the engine's clock, `advance_to(t)` (every
    iteration of the router loop that starts before t: the clock ends at or past t, by less than one step),
    `cancel` (charged the tokens produced by the clock); `advance()` is one iteration."""

    def __init__(
        self,
        ledger: Ledger,
        latency: LatencyModel,
        config: EngineConfig | None = None,
        observer: Callable[[SimEngine], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.latency = latency
        self.config = cfg = config or EngineConfig()
        self.observer = observer  # called after every prefill and decode step (the engine then moves step by step)
        self._open_clock()
        self.step = 0  # decode steps so far
        self.kv_used = 0  # = sum over running requests of server prompt + generated tokens
        self._extra = cfg.prompt_extra_tokens
        self._kv, self._paged, self._wait = cfg.kv_tokens, cfg.mode == "paged", cfg.wait_steps
        self._prefill_max, self._running_max = cfg.prefill_tokens, cfg.running_max
        self._per_client = 0 if self._paged else cfg.reserve_per_client_tokens
        self.running: dict[SimRequest, None] = {}  # admission order (paged mode evicts the newest)
        self._tenants: dict[str, list[SimRequest]] = {}  # the running requests by tenant
        self._ends: list[tuple[int, int, SimRequest]] = []  # (step at which it has all its tokens, seq, req)
        self._index = ReserveIndex() if cfg.mode == "reserve" else None  # the running set (reserve mode)
        self.prefills = self.preemptions = self.fair_preemptions = 0
        self._delta, self._cap = cfg.preempt_delta, cfg.running_cap
        self._open_cache()
        self._fit_tokens = cfg.pool_tokens - self._per_client  # a request must need fewer (prompt + output)
        # NOTE: no forecast of tries (below) with preemption, the cap or the prefix cache's blocks
        self._every_try = self._delta is not None or self._cap is not None or self.cache is not None
        caps = ledger.policy.capabilities
        if self._delta is not None and not caps.shares_counters:
            raise ValueError(f"preemption compares tenants' counters: policy {ledger.policy.name!r} keeps none")
        if not caps.orders_by_counter:
            self._charging = Charging.AT_END
        else:
            self._charging = Charging.LAZY if exact_charges(ledger) else Charging.EVERY_STEP
        self._lifts = caps.lifts
        # NOTE: LAZY, and every arrival accepted: an arrival of a tenant with requests queued changes nothing a decode
        # run reads (`_cut`)
        self._defer = type(ledger.policy).accept is Policy.accept and not self._every_try
        self._charged: dict[str, int] = {}  # LAZY: the step up to which each running tenant is charged
        self._queued = QueuedSizes(self._extra)  # LAZY: the queued requests' prefill sizes and tokens to go
        self._waited = 0  # decode steps since the last admission
        self._next_try = 0  # no admission can succeed before this step (until the next event)
        self._refused: Request | None = None  # the policy's next request, which did not fit at the last try
        self.just_finished: list[SimRequest] = []  # requests that finished in the last `advance()` / `advance_to()`
        self._pending: list[SimRequest] = []  # run(): the arrivals, in order, of which `_arrived` are submitted
        self._due: list[int] = []  # ... and the tick at which each is due
        self._arrived = 0
        self._horizon = FOREVER  # run(): the tick it stops at
        self._looked = (-1, 0, False)  # `_cut`'s last look: (prefills by then, the arrival it got to, it needs a stop)

    @property
    def kv_free(self) -> int:
        return self.config.kv_tokens - self.kv_used

    # ---- offline -----------------------------------------------------------------------------------------------
    def run(self, arrivals: Iterable, until_s: float | None = None) -> SimResult:
        """Simulate until every request is done, or until `until_s` (the rest is reported `unfinished`)."""
        # NOTE: the collector off for the run: its objects live to the end and make almost no cycles, and its passes
        # over them were a tenth of a million-request run
        collecting = gc.isenabled()
        gc.disable()
        try:
            reqs = sim_requests(arrivals)
            self._pending, self._due = reqs, [at_or_after(r.arrival_s) for r in reqs]
            self._horizon = FOREVER if until_s is None else at_or_after(until_s)
            while True:
                upcoming = self._arrive()
                if self._t >= self._horizon:
                    break
                self.just_finished.clear()
                if not self._advance(min(upcoming, self._horizon)):
                    if upcoming == FOREVER:
                        break
                    self._t = min(max(self._t, upcoming), self._horizon)  # idle until the next arrival
            self._pending, self._due = [], []
            self._sync()
            now = self.now
            records = [record_of(r, self.step, now) for r in reqs]
        finally:
            if collecting:
                if not gc.get_freeze_count():
                    # NOTE: the run's objects straight to the oldest generation: the young collection that follows
                    # would otherwise visit every one of them (a few % of a run); frozen objects of the caller's
                    # would be unfrozen, so not then
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()
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

    def _arrive(self) -> int:
        """Submit the pending arrivals due by now (offline); returns the tick at which the next one is due."""
        pending, due, i, t = self._pending, self._due, self._arrived, self._t
        while i < len(pending) and due[i] <= t:
            self.submit(pending[i])
            i += 1
        self._arrived = i
        return due[i] if i < len(pending) else FOREVER

    # ---- online ------------------------------------------------------------------------------------------------
    def advance(self) -> bool:
        """One iteration of the router loop: admit and prefill a (mini-)batch, or one decode step. Returns False when
        there is nothing to do (nothing running, nothing queued); `now` moves by the work's duration."""
        self.just_finished.clear()
        return self._advance(0)

    def advance_to(self, t: float) -> None:
        """Every iteration of the router loop that starts before `t` seconds: afterwards `now` >= t (past it by less
        than the last step), or the engine is idle and `now` = t (where it is, for an infinite t). `just_finished`
        holds the requests that finished."""
        self.just_finished.clear()
        until = at_or_after(t)
        while self._t < until:
            if not self._advance(until):
                self.idle_until(t)
                break

    def submit(self, req: SimRequest) -> None:
        """A request arrives (at `req.arrival_s`, which should not be later than `now`)."""
        prompt = req.prompt_tokens + self._extra  # NOTE: too_large(), inline: every arrival passes here
        if prompt + req.output_tokens >= self._fit_tokens or prompt > self._prefill_max:
            req.state = RequestState.REJECTED  # it could never be admitted
            return
        charging, acct = self._charging, self.ledger.accounts.get(req.tenant)
        if charging is Charging.LAZY and acct is None and SEP in req.tenant:
            self._sync()  # NOTE: the first tenant in a group: lazy charges no longer give the policy's choice
            self._charging = charging = Charging.EVERY_STEP
            self._next_try = 0
        was_backlogged = acct is not None and acct.queued > 0
        if charging is Charging.EVERY_STEP:
            if self.running:
                self._sync()
        elif charging is Charging.LAZY and self._lifts and not was_backlogged:
            self._head()  # the lift reads the smallest backlogged counter and this tenant's own
            self._charge(req.tenant)
        self.ledger.add(req, now=req.arrival_s)
        if req.state is not QUEUED:
            return
        if charging is Charging.LAZY:
            self._queued.add(req)
        if self._next_try > self.step and self.running and self.cache is None:
            # NOTE: an arrival does not reorder the requests queued before it, so only `req` can succeed sooner,
            # once it is first: it is, or (counters) it heads its tenant's queue, which the others' charges can lift
            # (LAZY: one level of flat tenants, so a request behind its tenant's queued ones is not first)
            if not was_backlogged if charging is Charging.LAZY else self.ledger.policy.peek() is req:
                hi = min(self._next_try, self._quiet_steps_cap())
                self._next_try = min(self._next_try, self._first_fit(req, self.step, hi))

    def cancel(self, req: SimRequest) -> None:
        """The client went away: drop a queued request, or stop a running one (it is charged what it produced)."""
        if req.state is RUNNING:
            req.generated = req.generated_at(self.step)
            self._stop(req)
            self.ledger.output(req, req.generated - req.output_done)
        elif req.state is QUEUED and self._charging is Charging.LAZY:
            self._queued.remove(req)
        self.ledger.settle(req, cancelled=True)
        self._next_try = 0

    def too_large(self, prompt_tokens: int, output_tokens: int) -> str | None:
        """Why a request of this size could never be admitted, or None if it can be."""
        return too_large(self.config, prompt_tokens, output_tokens)

    # ---- the router loop ---------------------------------------------------------------------------------------
    def _advance(self, until: int) -> bool:
        """Iterations of the router loop until the clock reaches tick `until` (an arrival, the horizon, advance_to's
        target; at least one): each admits and prefills a (mini-)batch, or decodes every step up to the next event
        or the first step that ends at or after `until`. False when there is nothing to do (nothing running,
        nothing queued)."""
        while True:
            if not self.running:
                if self.ledger.num_queued == 0:
                    return False
                self._waited = 0
                if not self._admit():
                    raise RuntimeError("nothing fits an empty engine")  # oversized requests are rejected earlier
            elif self._waited >= self._wait and self.ledger.num_queued and self.step >= self._next_try:
                self._try(until)
            else:
                self._decode(until)
            if self._t >= until or self.observer:
                return True

    def _try(self, until: int) -> None:
        """An admission try is due: admit, or, if nothing fits, decode up to when something could."""
        head = None
        if self._charging is not Charging.EVERY_STEP and not self._every_try:  # NOTE: a failing try is not needed
            head, hi = self._first(), self._quiet_steps_cap()
            first = self._first_fit(head, self.step, hi) if head is not None else NEVER
            if first != self.step:
                self._refused = head
                self._next_try = self._when_admission_can_succeed(self.step + 1, first, hi)
                self._decode(until)
                return
        if self._admit(head):
            self._waited = 0
            lo = self.step + self._wait
            # NOTE: a finish by the end of the wait comes before any try and makes a forecast moot
            if (
                self._charging is not Charging.EVERY_STEP
                and self.ledger.num_queued
                and self.running
                and self._next_finish() > lo
            ):
                self._refused = self._first()  # NOTE: after the prefill's charges; it did not fit this round
                self._next_try = self._when_admission_can_succeed(lo)
            return
        self._next_try = self._when_admission_can_succeed(self.step + 1)
        self._decode(until)

    def _admit(self, first: Request | None = None) -> bool:
        """An admission round (`first`: the policy's next request, if just looked up); with preemption on, while the
        request it stopped at can be made to fit by preempting (sim/preempt.py), preempt and run another round."""
        admitted = self._round(first)
        if self._delta is not None:
            while self._refused is not None and self.running and self._fair_preempt():
                admitted = self._round() or admitted
        return admitted

    def _round(self, first: Request | None = None) -> bool:
        """One admission round (`first`: the policy's next request, if just looked up)."""
        cfg, lazy = self.config, self._charging is Charging.LAZY
        if self._charging is Charging.EVERY_STEP:
            self._sync()
        budget: ReserveBudget | PagedBudget
        if self._index is not None:
            budget = ReserveBudget(
                self._index,
                self.step,
                cfg.kv_tokens,
                cfg.prefill_tokens,
                cfg.running_max,
                self._extra,
                cfg.reserve_per_client_tokens,
                self._tenants,
            )
        else:
            budget = PagedBudget(
                self.kv_used,
                len(self.running),
                cfg.kv_tokens,
                cfg.prefill_tokens,
                cfg.running_max,
                self._extra,
                self.cache,
                self.keys_of,
            )
        batch: list[SimRequest] = []
        peek, pop = self._head if lazy else self.ledger.policy.peek, self.ledger.pop
        fits = budget.try_add if self._cap is None else Capped(budget.try_add, self._cap, self._tenants, self._extra)
        while True:  # as Ledger.admit, with the counters the policy reads brought up to date first (LAZY)
            req, first = first or peek(), None
            if req is None or not fits(req):  # type: ignore[arg-type]  # NOTE: it holds SimRequests only
                break
            if self.cache is not None and not req.admitted:
                req.cached_tokens = self.cached_tokens(req)  # NOTE: before pop, which charges them (w_cached)
            pop(req)
            if lazy:
                self._queued.remove(req)  # type: ignore[arg-type]
            if self.cache is not None:
                budget.take(req)  # type: ignore[union-attr, arg-type]  # NOTE: paged (the cache needs it)
            batch.append(req)  # type: ignore[arg-type]
        self._refused = req
        budget.close()
        if batch:
            self._prefill(batch)
        return bool(batch)

    def _prefill(self, batch: list[SimRequest]) -> None:
        start = self.now
        lens = [r.prompt_tokens + self._extra + r.generated for r in batch]
        if self.cache is None:
            dt = ticks(self.latency.prefill_s(lens))
        else:
            cached = [r.held.cached_tokens for r in batch]  # type: ignore[union-attr]  # NOTE: held once admitted
            dt = ticks(prefill_cached_s(self.latency, [n - c for n, c in zip(lens, cached, strict=True)], cached))
        self._t += dt
        self._busy += dt
        now = self.now
        self.prefills += 1
        step = self.step
        for r in batch:
            if r.admit_s is None:
                r.admit_s = start
            if r.first_token_s is None:
                r.first_token_s = now
            r.generated += 1  # the prefill produces one token
            r.step_base = step
            self.kv_used += r.prompt_tokens + self._extra + r.generated
            self.running[r] = None
            self._start(r)
            r.end_step = step + r.output_tokens - r.generated  # NOTE: the reserve index has it (ReserveBudget.close)
            if r.end_step == step:
                self._finish(r)
            else:
                heapq.heappush(self._ends, (r.end_step, r.seq, r))
        self._next_try = 0
        if self.observer:
            self.observer(self)

    def _decode(self, until: int) -> None:
        """Decode steps up to the next event; arrivals on the way (offline) are submitted at their step boundary
        (or at the run's end: `_cut`), and the steps go on if they change nothing that is due."""
        n = len(self.running)
        if self.cache is not None:
            self._grow_blocks()
            n = len(self.running)
            if not n:
                self._waited += 1
                return
        elif self._paged and self.kv_used + n > self._kv:
            while self.kv_used + len(self.running) > self._kv:
                self._preempt(next(reversed(self.running)))
            n = len(self.running)
            if not n:
                self._waited += 1
                return
        steps = max(1, self._quiet_steps(n))  # NOTE: an iteration that decodes decodes at least one step
        if self._defer and self._charging is Charging.LAZY:
            until = self._cut(until)
        while True:
            done = self._run_steps(n, steps, until)
            self.step = step = self.step + done
            self.kv_used += n * done
            self._waited += done
            ends = self._ends
            if ends and ends[0][0] <= step:
                while ends and ends[0][0] <= step:
                    e, _, r = heapq.heappop(ends)
                    if r.state is RUNNING and r.end_step == e:  # NOTE: a preempted run's entry drops here
                        r.generated = r.generated_at(step)
                        self._finish(r)
                break
            if self.observer or self._t >= self._horizon or self.cache is not None:
                break  # NOTE: with the prefix cache, the next step may need blocks (_grow_blocks)
            if not (self._arrived < len(self._pending) and self._due[self._arrived] <= self._t):
                break  # the steps planned are done, or the clock reached `until`
            until = min(self._arrive(), self._horizon)
            if self._defer and self._charging is Charging.LAZY:
                until = self._cut(until)
            steps = self._quiet_steps(n)
            if steps < 1:
                break  # the arrivals made a try due
        if self.observer:
            self.observer(self)

    def _cut(self, until: int) -> int:
        """Offline, charging lazily: when the decode run must stop for an arrival (`until`: the next arrival's tick).
        An arrival of a tenant with requests queued gets no lift, does not reorder the queue ahead of it and moves no
        forecast (`submit`), and nothing before the next decision reads it: the run goes past it (up to `LOOKAHEAD`
        of them), and it is submitted at the run's end, in arrival order, with the same effect."""
        pending, i = self._pending, self._arrived
        if i >= len(pending):
            return until  # NOTE: online (advance_to's target), or no arrival left
        # NOTE: what the last look found stands until a request is admitted (only that empties a tenant's queue)
        admitted, j, stop = self._looked
        if admitted != self.prefills or j < i:
            j, stop = i, False
        elif stop:
            return min(self._due[j], self._horizon)
        accounts, end = self.ledger.accounts, min(i + LOOKAHEAD, len(pending))
        while j < end:
            acct = accounts.get(pending[j].tenant)
            if acct is None or not acct.queued:
                self._looked = (self.prefills, j, True)
                return min(self._due[j], self._horizon)
            j += 1
        self._looked = (self.prefills, j, False)
        return min(self._due[j] if j < len(pending) else FOREVER, self._horizon)

    def _quiet_steps(self, n: int) -> int:
        """The decode steps from now to the next event: a finish, an admission that may succeed, the pool running
        out (paged). 0 if a try is due now."""
        if self.observer or self.cache is not None:
            return 1
        step = self.step
        steps = self._next_finish() - step
        if self._paged:
            room = (self._kv - self.kv_used - n) // n + 1
            if room < steps:
                steps = room
        if self.ledger.num_queued:
            wait = self._wait - self._waited
            try_in = self._next_try - step
            if wait < try_in:
                wait = try_in
            if wait < steps:
                steps = wait
        return steps

    # ---- requests starting and stopping ------------------------------------------------------------------------
    def _start(self, r: SimRequest) -> None:
        group = self._tenants.get(r.tenant)
        if self._charging is Charging.LAZY:
            if group:
                self._charge(r.tenant)
            self._charged[r.tenant] = self.step
            self.ledger.output(r, r.generated - r.output_done)  # its first token: now its tenant is up to date
        if group is None:
            self._tenants[r.tenant] = [r]
        else:
            group.append(r)

    def _stop(self, r: SimRequest) -> None:
        """Take a running request out of the batch (it ends or is preempted)."""
        del self.running[r]
        group = self._tenants[r.tenant]
        group.remove(r)
        if not group:
            del self._tenants[r.tenant]
            self._charged.pop(r.tenant, None)
        if self._index is not None:
            self._index.remove(r.end_step, r.prompt_tokens + self._extra + r.output_tokens)
        self.kv_used -= r.prompt_tokens + self._extra + r.generated
        if r.held is not None:
            self._release(r)
        self._next_try = 0

    def _finish(self, r: SimRequest) -> None:
        self._stop(r)
        r.finish_s = r.last_token_s = self.now
        self.ledger.output(r, r.generated - r.output_done)
        self.ledger.settle(r)
        self.just_finished.append(r)

    def _preempt(self, r: SimRequest) -> None:
        """Evict-and-recompute, as vLLM: free its KV cache; it re-prefills prompt + generated tokens later."""
        r.generated = r.generated_at(self.step)
        self._stop(r)
        self.ledger.output(r, r.generated - r.output_done)
        self.ledger.requeue(r)
        self.preemptions += 1
        if self._charging is Charging.LAZY:
            self._queued.add(r)
