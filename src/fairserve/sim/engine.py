"""A discrete-event simulation of one continuous-batching LLM server driving a fairserve policy.

The loop is the S-LoRA / LightLLM router's: with nothing running, admit a batch and prefill it; otherwise decode up
to `max_wait_steps` steps, then try to admit a mini-batch (prefill and merge it), and keep decoding if nothing fits.
Time advances by the latency model's prefill and decode-step durations; arrivals join the policy at step boundaries
(with their true arrival time).

The engine moves from event to event: arrivals, admissions, finishes, preemptions. Between two events the batch does
not change, so a run of decode steps is one move: their durations come from the latency model in one vectorised
call and are added in order, as the step-by-step loop adds them (so every time is the same float); the next finish is
the top of a heap; the next step at which an admission could succeed is computed instead of tried step by step
(`_next_try`); charges are made when a decision reads the counters, not at every step. The records are the
step-by-step loop's, bit for bit (tests/support/oracle.py keeps that loop as the oracle).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import Literal

import numpy as np

from ..core.cost import LinearCost
from ..core.ledger import Ledger
from ..core.request import Request, RequestState
from ..records import RequestRecord
from ..workloads.base import DEFAULT_KV_TOKENS
from .budget import PagedBudget, ReserveBudget, ReserveIndex
from .latency import LatencyModel, decode_steps_s

Mode = Literal["reserve", "paged"]
RUNNING, QUEUED = RequestState.RUNNING, RequestState.QUEUED
NEVER = 1 << 62  # a step that never comes
SHORT_RUN = 32  # decode runs up to this many steps are added up in Python (numpy's calls cost more)


@dataclass(frozen=True)
class EngineConfig:
    kv_tokens: int = DEFAULT_KV_TOKENS  # KV-cache pool (A10G + Llama-2-7b in the paper)
    batch_max_tokens: int | None = None  # prefill budget per round; None = max(kv_tokens // 6, 3072)
    max_wait_steps: int | None = None  # decode steps between admission rounds; None = 10 (reserve), 0 (paged)
    mode: Mode = "reserve"
    running_max: int = 1000
    prompt_extra_tokens: int = 0  # the server tokenizes a p-token prompt as p + this (latency.ServerTokens)
    reserve_per_client_tokens: int = 0  # reserve admission: pool held back per distinct client in the batch

    def __post_init__(self) -> None:
        if self.mode not in ("reserve", "paged"):
            raise ValueError(f"engine mode must be 'reserve' or 'paged', got {self.mode!r}")
        if self.kv_tokens < 2:
            raise ValueError(f"kv_tokens must be >= 2, got {self.kv_tokens}")
        if self.prompt_extra_tokens < 0 or self.reserve_per_client_tokens < 0:
            raise ValueError("prompt_extra_tokens and reserve_per_client_tokens must be >= 0")

    @property
    def prefill_tokens(self) -> int:
        return self.batch_max_tokens if self.batch_max_tokens else max(self.kv_tokens // 6, 3072)

    @property
    def wait_steps(self) -> int:
        if self.max_wait_steps is not None:
            return self.max_wait_steps
        return 10 if self.mode == "reserve" else 0


@dataclass(slots=True, eq=False, kw_only=True)
class SimRequest(Request):
    output_tokens: int  # the true length; the client sends max_tokens = output_tokens (ignore_eos)
    generated: int = 0  # output tokens produced before the current run (non-zero after a preemption)
    step_base: int = 0  # decode-step counter when the current run's prefill finished
    end_step: int = 0  # decode step at which the current run has produced every token
    admit_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    last_token_s: float | None = None

    def generated_at(self, step: int) -> int:
        """Output tokens produced by decode step `step` (the prefill produced one)."""
        return self.generated + (step - self.step_base) if self.state is RequestState.RUNNING else self.generated


@dataclass
class SimResult:
    records: list[RequestRecord]
    ledger: Ledger
    end_s: float
    decode_steps: int
    prefills: int
    preemptions: int
    busy_s: float  # time spent prefilling or decoding (the rest the engine was idle)
    config: EngineConfig


class Charging(Enum):
    """When the engine charges decoded tokens (the counters must be up to date whenever a decision reads them)."""

    AT_END = "at the end"  # the order ignores charges (FCFS, rate limits): at finish, cancel and preemption only
    LAZY = "lazily"  # charges are exact in floating point: a tenant's running requests at once, when read
    EVERY_STEP = "every step"  # not exact: every request before every decision, in the step-by-step order


def exact_charges(ledger: Ledger) -> bool:
    """Every charge and counter is then an exact binary fraction, so grouping charges cannot change a bit: the
    policy admits the smallest counter first (a counter is a sum of charges / weight), the cost is linear with
    integral prices and every weight is a power of two."""
    cost = ledger.cost
    return (
        ledger.policy.capabilities.shares_counters
        and type(cost) is LinearCost
        and all(float(w).is_integer() and 0 <= w < 2**20 for w in (cost.w_p, cost.w_q))
        and all(math.frexp(a.weight)[0] == 0.5 for a in ledger.accounts.values())
    )


def too_large(cfg: EngineConfig, prompt_tokens: int, output_tokens: int) -> str | None:
    """Why a request of this size could never be admitted, or None if it can be."""
    prompt = prompt_tokens + cfg.prompt_extra_tokens
    pool = cfg.kv_tokens - (cfg.reserve_per_client_tokens if cfg.mode == "reserve" else 0)
    if prompt + output_tokens >= pool:
        return (
            f"This request needs {prompt + output_tokens} tokens of KV cache ({prompt} in the prompt + "
            f"{output_tokens} max_tokens), but the engine's pool holds {pool}. "
            "Reduce the prompt or max_tokens."
        )
    if prompt > cfg.prefill_tokens:
        return f"The prompt has {prompt} tokens; the engine prefills at most {cfg.prefill_tokens} at once."
    return None


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
        self.now = 0.0
        self.step = 0  # decode steps so far
        self.kv_used = 0  # = sum over running requests of server prompt + generated tokens
        self._extra = cfg.prompt_extra_tokens
        self.running: dict[SimRequest, None] = {}  # admission order (paged mode evicts the newest)
        self._tenants: dict[str, list[SimRequest]] = {}  # the running requests by tenant
        self._ends: list[tuple[int, int, SimRequest]] = []  # (step at which it has all its tokens, seq, req)
        self._index = ReserveIndex() if cfg.mode == "reserve" else None  # the running set (reserve mode)
        self.prefills = self.preemptions = 0
        self.busy_s = 0.0
        caps = ledger.policy.capabilities
        if not caps.orders_by_counter:
            self._charging = Charging.AT_END
        else:
            self._charging = Charging.LAZY if exact_charges(ledger) else Charging.EVERY_STEP
        self._lifts = caps.lifts
        self._charged: dict[str, int] = {}  # LAZY: the step up to which each running tenant is charged
        self._needs: list[tuple[int, int, SimRequest]] = []  # LAZY: queued requests by prefill size (lazy heap)
        self._lefts: list[tuple[int, int, SimRequest]] = []  # LAZY: ... and by tokens to go (reserve)
        self._waited = 0  # decode steps since the last admission
        self._next_try = 0  # no admission can succeed before this step (until the next event)
        self._refused: Request | None = None  # the policy's next request, which did not fit at the last try
        self.just_finished: list[SimRequest] = []  # requests that finished in the last `advance()` / `advance_to()`
        self._pending: list[SimRequest] = []  # run(): the arrivals, in order, of which `_arrived` are submitted
        self._arrived = 0
        self._horizon = float("inf")

    @property
    def kv_free(self) -> int:
        return self.config.kv_tokens - self.kv_used

    # ---- offline -----------------------------------------------------------------------------------------------
    def run(self, arrivals: Iterable, until_s: float | None = None) -> SimResult:
        """Simulate until every request is done, or until `until_s` (the rest is reported `unfinished`)."""
        reqs = [
            SimRequest(
                id=i,
                tenant=a.client,
                prompt_tokens=a.prompt_tokens,
                max_tokens=a.output_tokens,
                predicted_output=a.output_tokens,
                arrival_s=a.arrival_s,
                output_tokens=a.output_tokens,
            )
            for i, a in enumerate(arrivals)
        ]
        reqs.sort(key=lambda r: r.arrival_s)
        self._pending, self._horizon = reqs, float("inf") if until_s is None else until_s
        while True:
            upcoming = self._arrive()
            if self.now >= self._horizon:
                break
            self.just_finished.clear()
            if not self._advance(min(upcoming, self._horizon)):
                if upcoming == float("inf"):
                    break
                self.now = min(max(self.now, upcoming), self._horizon)  # idle until the next arrival
        self._pending = []
        self._sync()
        return SimResult(
            [record_of(r, self.step, self.now) for r in reqs],
            self.ledger,
            self.now,
            self.step,
            self.prefills,
            self.preemptions,
            self.busy_s,
            self.config,
        )

    def _arrive(self) -> float:
        """Submit the pending arrivals due by now (offline); returns when the next one is due."""
        pending, i, now = self._pending, self._arrived, self.now
        while i < len(pending) and pending[i].arrival_s <= now:
            self.submit(pending[i])
            i += 1
        self._arrived = i
        return pending[i].arrival_s if i < len(pending) else float("inf")

    # ---- online ------------------------------------------------------------------------------------------------
    def advance(self) -> bool:
        """One iteration of the router loop: admit and prefill a (mini-)batch, or one decode step. Returns False when
        there is nothing to do (nothing running, nothing queued); `now` moves by the work's duration."""
        self.just_finished.clear()
        return self._advance(-float("inf"))

    def advance_to(self, t: float) -> None:
        """Every iteration of the router loop that starts before `t`: afterwards `now` >= t (past it by less than
        the last step), or the engine is idle and `now` = t. `just_finished` holds the requests that finished."""
        self.just_finished.clear()
        while self.now < t:
            if not self._advance(t):
                self.now = t
                break

    def submit(self, req: SimRequest) -> None:
        """A request arrives (at `req.arrival_s`, which should not be later than `now`)."""
        if too_large(self.config, req.prompt_tokens, req.output_tokens) is not None:
            req.state = RequestState.REJECTED  # it could never be admitted
            return
        acct = self.ledger.accounts.get(req.tenant)
        was_backlogged = acct is not None and acct.queued > 0
        if self._charging is Charging.EVERY_STEP:
            if self.running:
                self._sync()
        elif self._charging is Charging.LAZY and self._lifts and not was_backlogged:
            self._head()  # the lift reads the smallest backlogged counter and this tenant's own
            self._charge(req.tenant)
        self.ledger.add(req, now=req.arrival_s)
        if req.state is not QUEUED:
            return
        if self._charging is Charging.LAZY:
            self._queue_sizes(req)
        if self._next_try > self.step and self.running:
            # NOTE: an arrival does not reorder the requests queued before it, so only `req` can succeed sooner,
            # once it is first: it is, or (counters) it heads its tenant's queue, which the others' charges can lift
            if self.ledger.peek() is req or (self._charging is Charging.LAZY and not was_backlogged):
                hi = min(self._next_try, self._quiet_steps_cap())
                self._next_try = min(self._next_try, self._first_fit(req, self.step, hi))

    def cancel(self, req: SimRequest) -> None:
        """The client went away: drop a queued request, or stop a running one (it is charged what it produced)."""
        if req.state is RUNNING:
            req.generated = req.generated_at(self.step)
            self._stop(req)
            self.ledger.output(req, req.generated - req.output_done)
        self.ledger.settle(req, cancelled=True)
        self._next_try = 0

    def too_large(self, prompt_tokens: int, output_tokens: int) -> str | None:
        """Why a request of this size could never be admitted, or None if it can be."""
        return too_large(self.config, prompt_tokens, output_tokens)

    # ---- the router loop ---------------------------------------------------------------------------------------
    def _advance(self, until: float) -> bool:
        """One iteration of the router loop, or, when it decodes, every decode step up to the next event or the
        first step that ends at or after `until` (an arrival, the horizon)."""
        if not self.running:
            if self.ledger.num_queued == 0:
                return False
            self._waited = 0
            if not self._admit():
                raise RuntimeError("nothing fits an empty engine")  # oversized requests are rejected earlier
            return True
        wait = self.config.wait_steps
        if self._waited >= wait and self.ledger.num_queued and self.step >= self._next_try:
            if self._charging is not Charging.EVERY_STEP:  # NOTE: a try that would fail is not needed to know it
                head = self._first()
                if head is not None and self._first_fit(head, self.step, self.step + 1) != self.step:
                    self._refused = head
                    self._next_try = self._when_admission_can_succeed(self.step + 1)
                    self._decode(until)
                    return True
            if self._admit():
                self._waited = 0
                if self._charging is not Charging.EVERY_STEP and self.running and self.ledger.num_queued:
                    self._refused = self._first()  # after the prefill's charges
                    self._next_try = self._when_admission_can_succeed(self.step + wait)
                return True
            self._next_try = self._when_admission_can_succeed(self.step + 1)
        self._decode(until)
        return True

    def _admit(self) -> bool:
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
                self.kv_used, len(self.running), cfg.kv_tokens, cfg.prefill_tokens, cfg.running_max, self._extra
            )
        batch: list[SimRequest] = []
        peek, pop = self._head if lazy else self.ledger.peek, self.ledger.pop
        while True:  # as Ledger.admit, with the counters the policy reads brought up to date first (LAZY)
            req = peek()
            if req is None or not budget.try_add(req):  # type: ignore[arg-type]  # NOTE: it holds SimRequests only
                break
            pop()
            batch.append(req)  # type: ignore[arg-type]
        self._refused = req
        budget.close()
        if batch:
            self._prefill(batch)
        return bool(batch)

    def _prefill(self, batch: list[SimRequest]) -> None:
        start = self.now
        dt = self.latency.prefill_s([r.prompt_tokens + self._extra + r.generated for r in batch])
        self.now += dt
        self.busy_s += dt
        self.prefills += 1
        step = self.step
        for r in batch:
            if r.admit_s is None:
                r.admit_s = start
            if r.first_token_s is None:
                r.first_token_s = self.now
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

    def _decode(self, until: float) -> None:
        """Decode steps up to the next event; arrivals on the way (offline) are submitted at their step boundary,
        and the steps go on if they change nothing that is due."""
        cfg, n = self.config, len(self.running)
        if cfg.mode == "paged" and self.kv_used + n > cfg.kv_tokens:
            while self.kv_used + len(self.running) > cfg.kv_tokens:
                self._preempt(next(reversed(self.running)))
            n = len(self.running)
            if not n:
                self._waited += 1
                return
        steps = max(1, self._quiet_steps(n))  # NOTE: an iteration that decodes decodes at least one step
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
            if self.observer or self.now >= self._horizon:
                break
            if not (self._arrived < len(self._pending) and self._pending[self._arrived].arrival_s <= self.now):
                break  # the steps planned are done, or the clock reached `until`
            until = min(self._arrive(), self._horizon)
            steps = self._quiet_steps(n)
            if steps < 1:
                break  # the arrivals made a try due
        if self.observer:
            self.observer(self)

    def _quiet_steps(self, n: int) -> int:
        """The decode steps from now to the next event: a finish, an admission that may succeed, the pool running
        out (paged). 0 if a try is due now."""
        cfg, step = self.config, self.step
        if self.observer:
            return 1
        steps = self._next_finish() - step
        if cfg.mode == "paged":
            steps = min(steps, (cfg.kv_tokens - self.kv_used - n) // n + 1)
        if self.ledger.num_queued:
            steps = min(steps, max(cfg.wait_steps - self._waited, self._next_try - step))
        return steps

    def _next_finish(self) -> int:
        ends = self._ends
        while ends and (ends[0][2].state is not RUNNING or ends[0][2].end_step != ends[0][0]):
            heapq.heappop(ends)  # a preempted run's or a cancelled request's
        return ends[0][0] if ends else NEVER

    def _run_steps(self, n: int, steps: int, until: float) -> int:
        """Decode `steps` steps of the batch (stopping after the first that ends at or after `until`); returns how
        many. Durations are added one at a time, in order, exactly as a loop over the steps adds them."""
        now, busy, kv, one = self.now, self.busy_s, self.kv_used, self.latency.decode_step_s
        dt = one(n, kv)
        if dt > 0 and until - now < (SHORT_RUN - 1) * dt:
            steps = min(steps, SHORT_RUN)  # NOTE: steps only grow longer with the context: `until` comes first
        done = 0
        if steps <= SHORT_RUN:
            while True:
                now += dt
                busy += dt
                kv += n
                done += 1
                if done == steps or now >= until:
                    break
                dt = one(n, kv)
        else:
            while done < steps and now < until:
                take = steps - done
                if dt > 0 and until != float("inf"):
                    take = min(take, max(SHORT_RUN, int((until - now) / dt) + 2))
                dts = decode_steps_s(self.latency, n, kv, take)
                ends = np.cumsum(np.concatenate(([now], dts)))  # sequential: the same sums as the loop's
                take = min(take, int(np.searchsorted(ends, until, side="left")))
                now = float(ends[take])
                busy = float(np.cumsum(np.concatenate(([busy], dts[:take])))[-1])
                kv += n * take
                done += take
                dt = one(n, kv)
        self.now, self.busy_s = now, busy
        return done

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
            self._queue_sizes(r)

    # ---- charging ----------------------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Charge every running request for the tokens decoded since its last charge."""
        if self._charging is Charging.LAZY:
            for tenant in self._tenants:
                self._charge(tenant)
            return
        step, output = self.step, self.ledger.output
        for r in self.running:
            n = r.generated + step - r.step_base - r.output_done
            if n:
                output(r, n)

    def _charge(self, tenant: str) -> None:
        """LAZY: charge `tenant`'s running requests up to this step, in one charge."""
        behind = self.step - self._charged.get(tenant, self.step)  # 0 for a tenant with nothing running
        if behind:
            self.ledger.outputs(self._tenants[tenant], behind)
            self._charged[tenant] = self.step

    def _first(self) -> Request | None:
        """The policy's next request (LAZY: with the counters it reads up to date)."""
        return self._head() if self._charging is Charging.LAZY else self.ledger.peek()

    def _head(self) -> Request | None:
        """LAZY: the policy's next request, with up-to-date counters wherever it looks. A charge only moves a tenant
        back in the order (the smallest counter goes first), so charging just the tenants the policy picks, until
        it picks one that is up to date, gives its choice under every counter up to date."""
        peek, charged, step, tenants = self.ledger.peek, self._charged, self.step, self._tenants
        while True:
            req = peek()
            if req is None or req.tenant not in tenants or charged[req.tenant] == step:
                return req
            self._charge(req.tenant)

    # ---- when an admission can succeed -------------------------------------------------------------------------
    def _when_admission_can_succeed(self, lo: int) -> int:
        """After a try that stopped at a request that did not fit (`_refused`): the first step from `lo` on at which a
        try could admit something, while nothing happens (every event resets it). The policy's next request fits
        again at a step the reserve index computes (in paged mode, not before the pool grows); another request can
        only be first if the next one's tenant is charged past the others, and only fit where the smallest queued
        sizes fit."""
        if self._charging is Charging.EVERY_STEP:
            return lo  # NOTE: the counters must take every step's charges, as step by step
        head = self._refused
        if head is None:
            return NEVER
        hi = self._quiet_steps_cap()
        first = self._first_fit(head, lo, hi)
        if self._charging is Charging.AT_END or head.tenant not in self._tenants:
            return first  # the order cannot change without an event
        some, last = self._first_fit_smallest(lo, min(first, hi))
        if some >= first:
            return first
        until = min(first, hi, last + 1) - 1  # someone else could fit at some step in [some, until]
        proven = self._first_through(head, until)
        return first if proven >= until else max(some, proven + 1)

    def _quiet_steps_cap(self) -> int:
        """The first step whose try follows an event: the next finish (a finish comes before the try at its step),
        or, paged, the step after the pool runs out (the try at that step comes before the preemption)."""
        cap = self._next_finish()
        if self.config.mode == "paged":
            n = len(self.running)
            cap = min(cap, self.step + (self.config.kv_tokens - self.kv_used - n) // n + 2)
        return cap

    def _first_fit(self, req: Request, lo: int, hi: int) -> int:
        """The first step in [lo, hi) at which `req` fits the batch as it is (NEVER if none)."""
        cfg, r = self.config, req
        assert isinstance(r, SimRequest)
        need = r.prompt_tokens + self._extra + r.generated
        if need > cfg.prefill_tokens or len(self.running) + 1 > cfg.running_max:
            return NEVER
        if self._index is None:  # paged: it fits while the pool has room for it, which only shrinks
            free = cfg.kv_tokens - self.kv_used - len(self.running) * (lo - self.step)
            return lo if lo < hi and need + 1 <= free else NEVER
        adapters = len(self._tenants) + (r.tenant not in self._tenants)
        limit = cfg.kv_tokens - cfg.reserve_per_client_tokens * adapters
        g = self._index.first_fit(need + 1, r.output_tokens - r.generated - 1, limit, lo, hi)
        return NEVER if g is None else g

    def _first_fit_smallest(self, lo: int, hi: int) -> tuple[int, int]:
        """A request made of the smallest prefill and the fewest tokens to go among the queued ones fits no later
        than any queued request does: (the first step in [lo, hi) at which it fits, the last step it fits)."""
        cfg = self.config
        need = _smallest(self._needs, self._need)
        if need is None or need > cfg.prefill_tokens or len(self.running) + 1 > cfg.running_max:
            return NEVER, -1
        if self._index is None:  # paged: it fits while the pool has room for it
            last = self.step + (cfg.kv_tokens - self.kv_used - need - 1) // len(self.running)
            return (lo if lo <= last and lo < hi else NEVER), last
        left = _smallest(self._lefts, self._left)
        assert left is not None
        limit = cfg.kv_tokens - cfg.reserve_per_client_tokens * len(self._tenants)
        g = self._index.first_fit(need + 1, left, limit, lo, hi)
        return (NEVER if g is None else g), NEVER

    def _first_through(self, head: Request, until: int) -> int:
        """The last step up to `until` through which `head` provably stays the policy's next request."""
        if self.ledger.predictor is not None:  # bisection: the steps at which it does form an interval from now
            if self._first_at(head, until) is None:
                return until
            lo, hi = self.step, until
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self._first_at(head, mid) is None:
                    lo = mid
                else:
                    hi = mid
            return lo
        while until > self.step:  # NOTE: linear counters: where the one picked instead overtook, then look again
            seen = self._first_at(head, until)
            if seen is None:
                return until
            until = self._overtaken(head, until, *seen) - 1
        return self.step

    def _first_at(self, head: Request, step: int) -> tuple[str, float, float, int] | None:
        """None if `head` is still the policy's next request at `step` (and so at every step from now to it), seen
        by charging ahead, then taking the charges back. Without a predictor every counter grows linearly, so two
        tenants in one order at both ends of the stretch are in it all along: the tenants the policy picks are
        charged up to `step` until it picks `head` or one charged already; for the one picked instead it returns
        (its tenant, its counter and head's at `step`, the step it was charged up to before). With a
        predictor only `head`'s tenant is charged ahead (the others only move back as they are charged, so that
        proves it too, less often)."""
        ahead: list[tuple[list[SimRequest], int]] = []
        accounts, charged = self.ledger.accounts, self._charged
        linear = self.ledger.predictor is None

        def forward(tenant: str) -> None:
            group, k = self._tenants[tenant], step - charged[tenant]
            self.ledger.outputs(group, k)
            ahead.append((group, k))

        try:
            forward(head.tenant)
            moved = {head.tenant}
            while True:
                req = self.ledger.peek()
                if req is head:
                    return None
                if req is None:
                    return ("", 0.0, 0.0, 0)
                t = req.tenant
                if linear and t in self._tenants and t not in moved:
                    forward(t)
                    moved.add(t)
                elif not linear and t in self._tenants and charged[t] != self.step:
                    self._charge(t)
                else:  # it goes first with its counter as it is
                    since = charged[t] if t in self._tenants else step
                    return (t, accounts[t].counter, accounts[head.tenant].counter, since)
        finally:
            for group, k in reversed(ahead):
                self.ledger.outputs(group, -k)

    def _overtaken(self, head: Request, at: int, tenant: str, counter: float, head_counter: float, since: int) -> int:
        """The first step after now at which `tenant` (its counter `counter` at step `at`, linear from the step
        `since` it is charged up to) may come before `head` (`head_counter` at `at`, linear from now): a tie
        counts, whatever the tie-break."""
        now = self.step
        if not tenant:
            return now + 1
        h0, o0 = Fraction(self.ledger.accounts[head.tenant].counter), Fraction(self.ledger.accounts[tenant].counter)
        h_rate = (Fraction(head_counter) - h0) / (at - now)
        o_rate = (Fraction(counter) - o0) / (at - since) if at > since else Fraction(0)
        gap = o0 + o_rate * (now - since) - h0  # how far `tenant` is behind at now; it closes at h_rate - o_rate
        if h_rate <= o_rate:
            return at
        return max(now + 1, now + math.ceil(gap / (h_rate - o_rate)))

    def _queue_sizes(self, r: SimRequest) -> None:
        heapq.heappush(self._needs, (self._need(r), r.seq, r))
        if self._index is not None:
            heapq.heappush(self._lefts, (self._left(r), r.seq, r))

    def _need(self, r: SimRequest) -> int:
        return r.prompt_tokens + self._extra + r.generated

    def _left(self, r: SimRequest) -> int:
        return r.output_tokens - r.generated - 1


def _smallest(heap: list[tuple[int, int, SimRequest]], size: Callable[[SimRequest], int]) -> int | None:
    """The smallest size among queued requests in a lazy heap (entries of admitted or resized requests drop)."""
    while heap:
        v, _, r = heap[0]
        if r.state is QUEUED and size(r) == v:
            return v
        heapq.heappop(heap)
    return None


def record_of(r: SimRequest, step: int, end_s: float) -> RequestRecord:
    status = {RequestState.FINISHED: "finished", RequestState.REJECTED: "rejected"}.get(r.state, "unfinished")
    if r.state is RequestState.RUNNING:
        r.last_token_s = end_s
    return RequestRecord(
        id=r.id,
        client=r.tenant,
        arrival_s=r.arrival_s,
        admit_s=r.admit_s,
        first_token_s=r.first_token_s,
        finish_s=r.finish_s,
        last_token_s=r.last_token_s,
        prompt_tokens=r.prompt_tokens,
        output_tokens=r.generated_at(step) if r.admit_s is not None else 0,
        max_tokens=r.output_tokens,
        status=status,
    )
