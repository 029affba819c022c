"""A discrete-event simulation of one continuous-batching LLM server driving a fairserve policy.

The loop is the S-LoRA / LightLLM router's: with nothing running, admit a batch and prefill it; otherwise decode up
to `max_wait_steps` steps, then try to admit a mini-batch (prefill and merge it), and keep decoding if nothing fits.
Time advances by the latency model's prefill and decode-step durations; arrivals join the policy at step boundaries
(with their true arrival time).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from ..core.ledger import Ledger
from ..core.request import Request, RequestState
from ..records import RequestRecord
from ..workloads.base import DEFAULT_KV_TOKENS
from .budget import PagedBudget, ReserveBudget, ReserveIndex
from .latency import LatencyModel

Mode = Literal["reserve", "paged"]


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


class SimEngine:
    """Drives a ledger (and so its policy) with the arrivals of a workload. One instance runs one simulation."""

    def __init__(
        self,
        ledger: Ledger,
        latency: LatencyModel,
        config: EngineConfig | None = None,
        observer: Callable[[SimEngine], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.latency = latency
        self.config = config or EngineConfig()
        self.observer = observer  # called after every prefill and decode step (tests, tracing)
        self.now = 0.0
        self.step = 0  # decode steps so far
        self.kv_used = 0  # = sum over running requests of server prompt + generated tokens
        self._extra = self.config.prompt_extra_tokens
        self.running: dict[SimRequest, None] = {}  # admission order (paged mode evicts the newest)
        self._ends: list[tuple[int, int, SimRequest]] = []  # (step at which it has all its tokens, seq, req)
        self._index: ReserveIndex | None = None  # cached per running set (reserve mode)
        self.prefills = self.preemptions = 0
        self.busy_s = 0.0
        # charge before every decision, or only when requests end
        self._eager = ledger.policy.capabilities.orders_by_counter
        self._waited = 0  # decode steps since the last admission
        self.just_finished: list[SimRequest] = []  # requests that finished in the last `advance()`

    @property
    def kv_free(self) -> int:
        return self.config.kv_tokens - self.kv_used

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
                self.now = min(max(self.now, reqs[i].arrival_s), horizon)  # idle until the next arrival
        self._sync()
        return SimResult(
            [_record(r, self.step, self.now) for r in reqs],
            self.ledger,
            self.now,
            self.step,
            self.prefills,
            self.preemptions,
            self.busy_s,
            self.config,
        )

    def advance(self) -> bool:
        """One iteration of the router loop: admit and prefill a (mini-)batch, or one decode step. Returns False when
        there is nothing to do (nothing running, nothing queued); `now` moves by the work's duration."""
        self.just_finished.clear()
        if not self.running:
            if self.ledger.num_queued == 0:
                return False
            self._waited = 0
            if not self._admit():
                raise RuntimeError("nothing fits an empty engine")  # oversized requests are rejected earlier
            return True
        if self._waited >= self.config.wait_steps and self.ledger.num_queued and self._admit():
            self._waited = 0
            return True
        self._decode()
        self._waited += 1
        return True

    def cancel(self, req: SimRequest) -> None:
        """The client went away: drop a queued request, or stop a running one (it is charged what it produced)."""
        if req.state is RequestState.RUNNING:
            req.generated = req.generated_at(self.step)
            self._index = None
            del self.running[req]
            self.kv_used -= req.prompt_tokens + self._extra + req.generated
            self.ledger.output(req, req.generated - req.output_done)
        self.ledger.settle(req, cancelled=True)

    # ---- events -------------------------------------------------------------------------------------------------
    def too_large(self, prompt_tokens: int, output_tokens: int) -> str | None:
        """Why a request of this size could never be admitted, or None if it can be."""
        cfg = self.config
        prompt = prompt_tokens + self._extra
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

    def submit(self, req: SimRequest) -> None:
        """A request arrives (at `req.arrival_s`, which should not be later than `now`)."""
        if self.too_large(req.prompt_tokens, req.output_tokens) is not None:
            req.state = RequestState.REJECTED  # it could never be admitted
            return
        if self._eager and self.running:
            self._sync()  # the counter lift compares against up-to-date counters
        self.ledger.add(req, now=req.arrival_s)

    def _admit(self) -> bool:
        cfg, running = self.config, list(self.running)
        if self._eager:
            self._sync()
        if cfg.mode == "reserve":
            if self._index is None:
                self._index = ReserveIndex(
                    [(r.end_step, r.prompt_tokens + self._extra + r.output_tokens) for r in running]
                )
            budget: ReserveBudget | PagedBudget = ReserveBudget(
                self._index,
                self.step,
                cfg.kv_tokens,
                cfg.prefill_tokens,
                cfg.running_max,
                self._extra,
                cfg.reserve_per_client_tokens,
                {r.tenant for r in running},
            )
        else:
            budget = PagedBudget(
                self.kv_used, len(running), cfg.kv_tokens, cfg.prefill_tokens, cfg.running_max, self._extra
            )
        # NOTE: this engine's ledger holds only SimRequests, so what it admits is one
        batch: list[SimRequest] = self.ledger.admit(budget.try_add)  # type: ignore[arg-type, assignment]
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
            r.end_step = step + r.output_tokens - r.generated
            if r.end_step == step:
                self._finish(r)
            else:
                heapq.heappush(self._ends, (r.end_step, r.seq, r))
        self._index = None
        if self.observer:
            self.observer(self)

    def _decode(self) -> None:
        if self.config.mode == "paged":
            while self.kv_used + len(self.running) > self.config.kv_tokens:
                self._preempt(next(reversed(self.running)))
            if not self.running:
                return
        n = len(self.running)
        dt = self.latency.decode_step_s(n, self.kv_used)
        self.now += dt
        self.busy_s += dt
        self.step += 1
        self.kv_used += n
        ends, step = self._ends, self.step
        while ends and ends[0][0] <= step:
            r = heapq.heappop(ends)[2]
            if r.state is RequestState.RUNNING:
                r.generated = r.generated_at(step)
                self._finish(r)
        if self.observer:
            self.observer(self)

    def _finish(self, r: SimRequest) -> None:
        self._index = None
        del self.running[r]
        self.kv_used -= r.prompt_tokens + self._extra + r.generated
        r.finish_s = r.last_token_s = self.now
        self.ledger.output(r, r.generated - r.output_done)
        self.ledger.settle(r)
        self.just_finished.append(r)

    def _preempt(self, r: SimRequest) -> None:
        """Evict-and-recompute, as vLLM: free its KV cache; it re-prefills prompt + generated tokens later."""
        r.generated = r.generated_at(self.step)
        self._index = None
        del self.running[r]
        self.kv_used -= r.prompt_tokens + self._extra + r.generated
        self._ends = [e for e in self._ends if e[2] is not r]
        heapq.heapify(self._ends)
        self.ledger.output(r, r.generated - r.output_done)
        self.ledger.requeue(r)
        self.preemptions += 1

    def _sync(self) -> None:
        """Charge every running request for the tokens decoded since its last charge."""
        step, output = self.step, self.ledger.output
        for r in self.running:
            n = r.generated + step - r.step_base - r.output_done
            if n:
                output(r, n)


def _record(r: SimRequest, step: int, end_s: float) -> RequestRecord:
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
