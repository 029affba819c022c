"""A discrete-event simulation of one continuous-batching LLM server driving a fairserve policy.

The loop is the S-LoRA / LightLLM router's: with nothing running, admit a batch and prefill it; otherwise decode up
to `max_wait_steps` steps, then try to admit a mini-batch (prefill and merge it), and keep decoding if nothing fits.
Time advances by the latency model's prefill and decode-step durations; arrivals join the policy at step boundaries
(with their true arrival time). The records are the step-by-step loop's, bit for bit (tests/support/oracle.py).

The engine moves from event to event (arrivals, admissions, finishes, preemptions), calling parts that own their
state: the running batch (sim/batch.py; the next finish is the top of a heap), the clock (sim/clock.py: a run of
decode steps is one move, in whole ticks), the memory model (sim/memory.py, sim/cached.py: the pool and its
admission budget), the charging rule (sim/charging.py: charges made when a decision reads the counters) and the
forecast it names (sim/forecast.py: the next step at which an admission could succeed, computed instead of tried),
preemption and the cap (sim/preempt.py) and, offline, the arrivals (sim/arrivals.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from ..core.ledger import Ledger
from ..core.policy import Policy
from ..core.request import Request, RequestState
from .arrivals import Arrivals, run_offline
from .batch import NEVER, Batch
from .charging import ChargeAtEnd, Charging, charging_rule
from .clock import Clock
from .latency import LatencyModel, decode_lines
from .memory import memory_model
from .preempt import preemption_rules
from .requests import EngineConfig, SimRequest, SimResult, sim_requests, too_large
from .ticks import at_or_after, run_ticks, ticks

RUNNING, QUEUED = RequestState.RUNNING, RequestState.QUEUED


class SimEngine:
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
        self.clock = Clock(latency)
        self.batch = batch = Batch()
        # NOTE: the batch's decode step, copied at each decode run: a plain attribute for readers per token (the
        # emulator's delivery)
        self.step = 0
        self.arrivals = Arrivals()
        self.prefills = self.preemptions = 0
        self._extra, self._wait, self._prefill_max = cfg.prompt_extra_tokens, cfg.wait_steps, cfg.prefill_tokens
        self.memory = memory = memory_model(cfg, batch, latency, self._preempt, ledger)
        self._check, self.preemption = preemption_rules(cfg, ledger, batch, memory, self._sync, self._preempt)
        # NOTE: no forecast of tries with preemption, the cap or the prefix cache's blocks
        self._every_try = (
            cfg.preempt_delta is not None or cfg.preempt_priority or cfg.running_cap is not None or memory.stepwise
        )
        self._stepwise = observer is not None or memory.stepwise  # one decode step at a time
        # NOTE: LAZY, and every arrival accepted: an arrival of a tenant with requests queued changes nothing a decode
        # run reads (`Arrivals.cut`)
        self._defer = type(ledger.policy).accept is Policy.accept and not self._every_try
        self._use(charging_rule(ledger, batch, self._extra))
        self._waited = 0  # decode steps since the last admission
        self._next_try = 0  # no admission can succeed before this step (until the next event)
        self._refused: Request | None = None  # the policy's next request, which did not fit at the last try
        self.just_finished: list[SimRequest] = []  # requests that finished in the last `advance()` / `advance_to()`
        self._to_finish = False  # `advance_to(..., to_finish=True)`: the router loop returns after a finish

    def _use(self, rule: ChargeAtEnd) -> None:
        """Charge by `rule` from now on, with the forecast it names."""
        self.charging = rule
        self.forecast = forecast = rule.forecast(self.memory, self._every_try)
        self._skips, self._looks_ahead = forecast.skips, forecast.looks_ahead
        self._cutting = self._defer and rule.lazy

    # ---- what the parts hold (the clock's, the batch's, ...) ----------------------------------------------------
    @property
    def now(self) -> float:
        return self.clock.now

    @property
    def busy_s(self) -> float:
        return self.clock.busy_s

    @property
    def kv_used(self) -> int:
        return self.batch.kv_used

    @kv_used.setter
    def kv_used(self, tokens: int) -> None:
        self.batch.kv_used = tokens

    @property
    def kv_free(self) -> int:
        return self.config.kv_tokens - self.batch.kv_used

    @property
    def running(self) -> dict[SimRequest, None]:
        return self.batch.running

    @property
    def cache(self):  # noqa: ANN201  # NOTE: PrefixCache | None
        return self.memory.cache

    @property
    def fair_preemptions(self) -> int:
        return self.preemption.count

    @property
    def _t(self) -> int:
        return self.clock.t

    @property
    def _busy(self) -> int:
        return self.clock.busy

    @property
    def _charging(self) -> Charging:
        return self.charging.mode

    def _sync(self) -> None:
        """Charge every running request for the tokens decoded since its last charge (observers that read the
        counters call it)."""
        self.charging.sync()

    def _fits(self, req: SimRequest, without: list[SimRequest]) -> bool:
        """Would `req` be admitted into the batch as it is, less the requests `without`?"""
        return self._check(self.memory.budget_without(without))(req)

    def _run_steps(self, n: int, steps: int, until: int) -> int:
        """A run of decode steps of the batch of `n` (`Clock.run`)."""
        return self.clock.run(n, steps, until, self.batch.kv_used)

    def idle_until(self, t: float) -> None:
        """Nothing to do until `t` seconds: the clock moves there (never back; nowhere for an infinite time)."""
        self.clock.idle_until(t)

    # ---- offline -----------------------------------------------------------------------------------------------
    def run(self, arrivals: Iterable, until_s: float | None = None) -> SimResult:
        """Simulate until every request is done, or until `until_s` (the rest is reported `unfinished`)."""
        return run_offline(self, sim_requests(arrivals), until_s)

    # ---- online ------------------------------------------------------------------------------------------------
    def advance(self) -> bool:
        """One iteration of the router loop: admit and prefill a (mini-)batch, or one decode step. Returns False when
        there is nothing to do (nothing running, nothing queued); `now` moves by the work's duration."""
        self.just_finished.clear()
        return self._advance(0)

    def advance_to(self, t: float, to_finish: bool = False) -> None:
        """Every iteration of the router loop that starts before `t` seconds: afterwards `now` >= t (past it by less
        than the last step), or the engine is idle and `now` = t (where it is, for an infinite t). `just_finished`
        holds the requests that finished. `to_finish`: stop also after the first iteration in which a request
        finished (a fleet's dispatcher then fills the room it left: sim/fleet.py)."""
        if not self.advance_until(at_or_after(t), to_finish):
            self.clock.idle_until(t)

    def advance_until(self, until: int, to_finish: bool = False) -> bool:
        """`advance_to` a tick; False if the engine went idle first (its clock then stays where the work ended)."""
        self.just_finished.clear()
        self._to_finish = to_finish
        while self.clock.t < until:
            if not self._advance(until):
                return False
            if to_finish and self.just_finished:
                break
        return True

    def next_finish_tick(self) -> int | None:
        """The tick at which the next request finishes, where nothing before it can change the run (nothing queued,
        the pool holds, decode lines known, not stepwise); None otherwise, or with nothing running."""
        batch = self.batch
        n = len(batch.running)
        if not n or self.ledger.num_queued or self._stepwise:
            return None
        steps = batch.next_finish() - batch.step
        lines = decode_lines(self.latency, n)
        if not lines or self.memory.room(n) < steps:
            return None
        return self.clock.t + run_ticks(lines, n, batch.kv_used, steps)

    def submit(self, req: SimRequest) -> None:
        """A request arrives (at `req.arrival_s`, which should not be later than `now`)."""
        prompt = req.prompt_tokens + self._extra  # NOTE: too_large(), inline: every arrival passes here
        if prompt + req.output_tokens >= self.memory.fit_tokens or prompt > self._prefill_max:
            req.state = RequestState.REJECTED  # it could never be admitted
            return
        acct = self.ledger.accounts.get(req.tenant)
        was_backlogged = acct is not None and acct.queued > 0
        rule = self.charging.arriving(req, acct, was_backlogged)
        if rule is not self.charging:
            self._use(rule)
            self._next_try = 0
        self.ledger.add(req, now=req.arrival_s)
        if req.state is not QUEUED:
            return
        rule.queued(req)
        batch = self.batch
        if self._next_try > batch.step and batch.running and not self.memory.stepwise:
            # NOTE: an arrival does not reorder the requests queued before it, so only `req` can succeed sooner,
            # once it is first: it is, or (counters) it heads its tenant's queue, which the others' charges can lift
            if rule.may_go_first(req, was_backlogged):
                hi = min(self._next_try, self.memory.quiet_cap())
                self._next_try = min(self._next_try, self.memory.first_fit(req, batch.step, hi))

    def cancel(self, req: SimRequest) -> None:
        """The client went away: drop a queued request, or stop a running one (it is charged what it produced)."""
        if req.state is RUNNING:
            req.generated = req.generated_at(self.batch.step)
            self._stop(req)
            self.ledger.output(req, req.generated - req.output_done)
        elif req.state is QUEUED:
            self.charging.dequeued(req)
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
        batch, ledger, clock = self.batch, self.ledger, self.clock
        running = batch.running
        while True:
            if not running:
                if ledger.num_queued == 0:
                    return False
                self._waited = 0
                if not self._admit():
                    raise RuntimeError("nothing fits an empty engine")  # oversized requests are rejected earlier
            elif self._waited >= self._wait and ledger.num_queued and batch.step >= self._next_try:
                self._try(until)
            else:
                self._decode(until)
            if clock.t >= until or self.observer or self._to_finish and self.just_finished:
                return True

    def _try(self, until: int) -> None:
        """An admission try is due: admit, or, if nothing fits, decode up to when something could."""
        head, batch, memory = None, self.batch, self.memory
        if self._skips:  # NOTE: the forecast knows a failing try: it is not made
            head = self.charging.first()
            step, hi = batch.step, memory.quiet_cap()
            first = memory.first_fit(head, step, hi) if head is not None else NEVER
            if first != step:
                self._refused = head
                self._next_try = self.forecast.when(step + 1, head, first, hi)
                self._decode(until)
                return
        if self._admit(head):
            self._waited = 0
            lo = batch.step + self._wait
            # NOTE: a finish by the end of the wait comes before any try and makes a forecast moot
            if self._looks_ahead and self.ledger.num_queued and batch.running and batch.next_finish() > lo:
                self._refused = self.charging.first()  # NOTE: after the prefill's charges; it did not fit this round
                self._next_try = self.forecast.when(lo, self._refused)
            return
        self._next_try = self.forecast.when(batch.step + 1, self._refused)
        self._decode(until)

    def _admit(self, first: Request | None = None) -> bool:
        """An admission round (`first`: the policy's next request, if just looked up); while the request it stopped
        at can be made to fit by preempting (sim/preempt.py), preempt and run another round."""
        admitted = self._round(first)
        while self._refused is not None and self.preemption.preempt():
            admitted = self._round() or admitted
        return admitted

    def _round(self, first: Request | None = None) -> bool:
        """One admission round (`first`: the policy's next request, if just looked up), as `Ledger.admit`, with the
        counters the policy reads brought up to date first (the charging rule's `round`)."""
        peek, pop = self.charging.round()
        budget = self.memory.budget()
        fits, take = self._check(budget), budget.take
        admitted: list[SimRequest] = []
        while True:
            req, first = first or peek(), None
            if req is None or not fits(req):  # type: ignore[arg-type]  # NOTE: it holds SimRequests only
                break
            pop(req)
            take(req)  # type: ignore[arg-type]
            admitted.append(req)  # type: ignore[arg-type]
        self._refused = req
        budget.close()
        if admitted:
            self._prefill(admitted)
        return bool(admitted)

    def _prefill(self, admitted: list[SimRequest]) -> None:
        clock, batch, extra = self.clock, self.batch, self._extra
        start = clock.now
        lens = [r.prompt_tokens + extra + r.generated for r in admitted]
        clock.spend(ticks(self.memory.prefill_s(admitted, lens)))
        now = clock.now
        self.prefills += 1
        step, running, ends, start_charges = batch.step, batch.running, batch.ends, self.charging.started
        tenants = batch.tenants
        for r in admitted:
            if r.admit_s is None:
                r.admit_s = start
            if r.first_token_s is None:
                r.first_token_s = now
            r.generated += 1  # the prefill produces one token
            r.step_base = step
            batch.kv_used += r.prompt_tokens + extra + r.generated
            running[r] = None
            group = tenants.get(r.tenant)
            start_charges(r, group)
            if group is None:
                tenants[r.tenant] = [r]
            else:
                group.append(r)
            r.end_step = step + r.output_tokens - r.generated  # NOTE: the reserve index has it (ReserveBudget.close)
            if r.end_step == step:
                self._finish(r)
            else:
                heapq.heappush(ends, (r.end_step, r.seq, r))
        self._next_try = 0
        if self.observer:
            self.observer(self)

    def _decode(self, until: int) -> None:
        """Decode steps up to the next event; arrivals on the way (offline) are submitted at their step boundary
        (or at the run's end: `Arrivals.cut`), and the steps go on if they change nothing that is due."""
        batch, clock, arrivals = self.batch, self.clock, self.arrivals
        n = self.memory.before_decode(len(batch.running))  # NOTE: the pool's part: blocks, or preemptions
        if not n:
            self._waited += 1
            return
        steps = max(1, self._quiet_steps(n))  # NOTE: an iteration that decodes decodes at least one step
        if self._cutting:
            until = arrivals.cut(until, self.prefills, self.ledger.accounts)
        run, ends, horizon = clock.run, batch.ends, arrivals.horizon
        while True:
            done = run(n, steps, until, batch.kv_used)
            self.step = batch.step = step = batch.step + done
            batch.kv_used += n * done
            self._waited += done
            if ends and ends[0][0] <= step:
                while ends and ends[0][0] <= step:
                    e, _, r = heapq.heappop(ends)
                    if r.state is RUNNING and r.end_step == e:  # NOTE: a preempted run's entry drops here
                        r.generated = r.generated_at(step)
                        self._finish(r)
                break
            if self._stepwise or clock.t >= horizon:
                break  # NOTE: with the prefix cache, the next step may need blocks (CachedMemory.before_decode)
            if not arrivals.due_by(clock.t):
                break  # the steps planned are done, or the clock reached `until`
            until = min(arrivals.arrive(clock.t, self.submit), horizon)
            if self._cutting:  # NOTE: read again: an arrival may have changed the charging rule
                until = arrivals.cut(until, self.prefills, self.ledger.accounts)
            steps = self._quiet_steps(n)
            if steps < 1:
                break  # the arrivals made a try due
        if self.observer:
            self.observer(self)

    def _quiet_steps(self, n: int) -> int:
        """The decode steps from now to the next event: a finish, an admission that may succeed, the pool running
        out (the memory model's `room`). 0 if a try is due now."""
        if self._stepwise:
            return 1
        batch = self.batch
        step = batch.step
        steps = batch.next_finish() - step
        room = self.memory.room(n)
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

    # ---- requests stopping -------------------------------------------------------------------------------------
    def _stop(self, r: SimRequest) -> None:
        """Take a running request out of the batch (it ends or is preempted)."""
        if self.batch.leave(r):
            self.charging.tenant_left(r.tenant)
        self.memory.stopped(r)
        self.batch.kv_used -= r.prompt_tokens + self._extra + r.generated
        self._next_try = 0

    def _finish(self, r: SimRequest) -> None:
        self._stop(r)
        r.finish_s = r.last_token_s = self.clock.now
        self.ledger.output(r, r.generated - r.output_done)
        self.ledger.settle(r)
        self.just_finished.append(r)

    def _preempt(self, r: SimRequest) -> None:
        """Evict-and-recompute, as vLLM: free its KV cache; it re-prefills prompt + generated tokens later."""
        r.generated = r.generated_at(self.batch.step)
        self._stop(r)
        self.ledger.output(r, r.generated - r.output_done)
        self.ledger.requeue(r)
        self.preemptions += 1
        self.charging.queued(r)
