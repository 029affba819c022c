"""`--engine-mode vllm`: the simulated engine admits and runs requests as vLLM v1's scheduler does, step by step.

Every engine step has a token budget (`max_num_batched_tokens`, `EngineConfig.batch_max_tokens`) and runs decodes
and prefill chunks together in one forward pass:

1. the running requests, in the order they were admitted: each gets what it still needs (one token for a decode, the
   rest of its prompt for a prefill, in a chunk no larger than what is left of the budget). Where the KV pool has no
   block left for it, the newest running request is preempted (evict and recompute: its blocks freed, back to the
   front of its tenant's queue, to re-prefill its prompt and the output it had). Before that, as fairserve's vLLM
   plugin does with a policy that keeps counters (`victim=counter`, its default; engines/vllm_preempt.py), when the
   step's requests need more blocks than are free, victims are taken in the core's `victim_order` (the highest
   counter's newest first) until they fit;
2. then, if nothing was preempted, the policy's queue (`Ledger.peek` / `pop`, as fairserve's vLLM plugin answers
   vLLM's `peek_request` / `pop_request`), while budget, blocks and `max_num_seqs` last: a request starts only if
   blocks for its whole sequence are free (vLLM's `scheduler_reserve_full_isl`), and is given its first chunk; with
   chunked prefill off, a prompt larger than the budget left waits for the next step.

The step takes the latency model's prefill time of its chunks plus the decode step of its decodes, less one fixed
cost (`step_s`). A request whose prefill completes in a step samples its first token at the step's end; a decode
samples one. Prompts are charged at admission and each output token as it is sampled (the vLLM plugin's charges).

This is the loop vLLM runs, without the event engine's closed-form runs (sim/engine.py): one iteration per step, for
fidelity to a real vLLM (benchmarks/fidelity_engine.py), not for million-request sweeps. Not here: the prefix cache,
the engine options of the other modes (`preempt=`, `running-cap=`, `preempt-priority=`), a fleet, the online API
(the emulator). Victims: `victim=counter|vllm` in the policy spec, as for the plugin.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import cast

from ..core.ledger import Ledger
from ..core.preemption import victim_order
from ..core.request import RequestState
from .latency import LatencyModel
from .requests import EngineConfig, SimRequest, SimResult, record_of, sim_requests, too_large
from .ticks import FOREVER, at_or_after, seconds, ticks

RUNNING, QUEUED, REJECTED = RequestState.RUNNING, RequestState.QUEUED, RequestState.REJECTED


def step_s(latency: LatencyModel, chunks: list[int], decodes: int, context: int) -> float:
    """One mixed step: the prefill of `chunks` (prompt tokens per request) and a decode step of `decodes` requests
    reading `context` KV tokens, with one step's fixed cost (the decode's is left out where both run).
    NOTE: a chunk is timed as a prompt of its size: its attention to the earlier chunks' tokens is not counted."""
    if not chunks:
        return latency.decode_step_s(decodes, context)
    if not decodes:
        return latency.prefill_s(chunks)
    fixed = latency.decode_step_s(0, 0)
    return latency.prefill_s(chunks) + latency.decode_step_s(decodes, context) - fixed


class VllmEngine:
    """One simulated vLLM engine driving a ledger (and so its policy). `run(arrivals)` runs a workload offline."""

    def __init__(self, ledger: Ledger, latency: LatencyModel, config: EngineConfig) -> None:
        if config.mode != "vllm":
            raise ValueError(f"VllmEngine runs engine mode 'vllm', got {config.mode!r}")
        self.ledger, self.latency, self.config = ledger, latency, config
        self.block = config.block_tokens
        self.free_blocks = config.kv_tokens // config.block_tokens
        self.budget_tokens, self.max_seqs = config.prefill_tokens, config.running_max
        counters = ledger.policy.capabilities.shares_counters
        by_counter = config.victim_by_counter
        if by_counter and not counters:
            raise ValueError(f"victim=counter compares tenants' counters: policy {ledger.policy.name!r} keeps none")
        self.by_counter = counters if by_counter is None else by_counter
        self.running: list[SimRequest] = []  # in admission order (vLLM's `running`)
        self.computed: dict[SimRequest, int] = {}  # KV tokens computed, per running request
        self.decoding: set[SimRequest] = set()  # running requests past their (re-)prefill
        self._held: dict[SimRequest, int] = {}  # KV blocks, per running request
        self.t = 0  # the clock, in ticks
        self.busy = 0  # ticks spent running steps
        self.steps = self.prefills = self.preemptions = 0

    @property
    def now(self) -> float:
        return seconds(self.t)

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block)

    # ---- offline -----------------------------------------------------------------------------------------------
    def run(self, arrivals: Iterable, until_s: float | None = None) -> SimResult:
        """Simulate until every request is done, or until `until_s` (the rest is reported `unfinished`)."""
        reqs = sim_requests(arrivals)
        due = [at_or_after(r.arrival_s) for r in reqs]
        horizon = FOREVER if until_s is None else at_or_after(until_s)
        collecting = gc.isenabled()
        gc.disable()  # NOTE: as sim/arrivals.py: the run's objects live to its end and make no cycles
        try:
            i = 0
            while self.t < horizon:
                while i < len(reqs) and due[i] <= self.t:
                    self.submit(reqs[i])
                    i += 1
                if self.running or self.ledger.num_queued:
                    self.step()
                elif i < len(reqs):
                    self.t = min(due[i], horizon)  # idle until the next arrival
                else:
                    break
        finally:
            if collecting:
                gc.enable()
        for r in self.running:
            r.step_base = self.steps  # NOTE: record_of counts a running request's output from its step base
        records = [record_of(r, self.steps, self.now) for r in reqs]
        return SimResult(
            records, self.ledger, self.now, self.steps, self.prefills, self.preemptions, seconds(self.busy), self.config
        )

    def submit(self, req: SimRequest) -> None:
        """A request arrives: queued, or rejected if it could never run on this engine."""
        if too_large(self.config, req.prompt_tokens, req.output_tokens) is not None:
            req.state = REJECTED
            return
        self.ledger.add(req, now=req.arrival_s)

    # ---- one step: schedule, run, update -----------------------------------------------------------------------
    def step(self) -> None:
        start = self.now
        scheduled = self._schedule(start)
        if not scheduled:
            raise RuntimeError("a step scheduled nothing")  # NOTE: oversized requests are rejected at arrival
        chunks, decodes, context = [], 0, 0
        for r, n in scheduled:
            if r in self.decoding:
                decodes += 1
                context += self.computed[r]
            else:
                chunks.append(n)
        spent = ticks(step_s(self.latency, chunks, decodes, context))
        self.t += spent
        self.busy += spent
        self.steps += 1
        self.prefills += bool(chunks)
        self._update(scheduled)

    def _schedule(self, now: float) -> list[tuple[SimRequest, int]]:
        """What runs this step, and how many tokens of each: the running requests first, then admissions."""
        budget, running, computed = self.budget_tokens, self.running, self.computed
        scheduled: list[tuple[SimRequest, int]] = []
        preempted = self.by_counter and self._evict_by_counter()
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(self._tokens(r) - computed[r], budget)
            while not self._allocate(r, n):
                victim = running[-1]  # NOTE: vLLM's FCFS rule: the newest running request gives way
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            else:
                scheduled.append((r, n))
                budget -= n
                i += 1
                continue
            break
        if not preempted:  # NOTE: vLLM admits nothing in a step that preempted
            self._admit(budget, scheduled, now)
        return scheduled

    def _admit(self, budget: int, scheduled: list[tuple[SimRequest, int]], now: float) -> None:
        """Admissions in the policy's order while the budget, the pool and `max_num_seqs` allow."""
        ledger, running = self.ledger, self.running
        while budget > 0 and len(running) < self.max_seqs:
            head = cast("SimRequest | None", ledger.peek())  # NOTE: it holds SimRequests only
            if head is None:
                break
            need = self._tokens(head)
            if need > budget and not self.config.chunked_prefill:
                break
            if self._blocks(need) > self.free_blocks:
                break  # NOTE: vLLM's `scheduler_reserve_full_isl` (its default): the whole sequence must fit to start
            n = min(need, budget)
            self.computed[head] = 0
            self._allocate(head, n)
            ledger.pop(head)  # NOTE: the head just peeked: the policy is not asked again
            running.append(head)
            if head.admit_s is None:
                head.admit_s = now
            scheduled.append((head, n))
            budget -= n

    def _evict_by_counter(self) -> bool:
        """`victim=counter`: when the running requests' next tokens (within the budget) need more blocks than are
        free, preempt in `victim_order` until they fit, leaving the last one to vLLM's rule. Whether any was."""
        budget, free, needs = self.budget_tokens, self.free_blocks, {}
        for r in self.running:
            n = max(0, min(self._tokens(r) - self.computed[r], budget))
            budget -= n
            needs[r] = self._blocks(self.computed[r] + n) - self._held[r] if n else 0
        need = sum(needs.values())
        if need <= free:
            return False
        victims: list[SimRequest] = []
        for r in victim_order(self.running, self.ledger.accounts):
            if need <= free or len(victims) == len(self.running) - 1:
                break
            victims.append(r)
            need -= needs[r]
            free += self._held[r]
        for r in victims:
            self._preempt(r)
        return bool(victims)

    def _tokens(self, r: SimRequest) -> int:
        """The tokens whose KV the request needs: its prompt and the output sampled so far."""
        return r.prompt_tokens + self.config.prompt_extra_tokens + r.generated

    def _allocate(self, r: SimRequest, n: int) -> bool:
        """Blocks for `n` more tokens of `r`, if the pool has them (vLLM's `allocate_slots`)."""
        have = self.computed[r]
        more = self._blocks(have + n) - self._blocks(have)
        if more > self.free_blocks:
            return False
        self.free_blocks -= more
        self._held[r] = self._held.get(r, 0) + more
        return True

    def _update(self, scheduled: list[tuple[SimRequest, int]]) -> None:
        """After the step: the KV computed, a token sampled where a (re-)prefill completed or a decode ran."""
        now, ledger, computed = self.now, self.ledger, self.computed
        for r, n in scheduled:
            done = computed[r] = computed[r] + n
            if done < self._tokens(r):
                continue  # NOTE: a prefill chunk short of the prompt samples nothing
            self.decoding.add(r)
            r.generated += 1
            ledger.output(r, 1)
            if r.first_token_s is None:
                r.first_token_s = now
            if r.generated >= r.output_tokens:
                self._stop(r)
                r.finish_s = r.last_token_s = now
                ledger.settle(r)

    def _stop(self, r: SimRequest) -> None:
        self.running.remove(r)
        del self.computed[r]
        self.decoding.discard(r)
        self.free_blocks += self._held.pop(r, 0)

    def _preempt(self, r: SimRequest) -> None:
        """Evict and recompute: its blocks freed, back to the front of its tenant's queue (no new charge)."""
        self._stop(r)
        self.ledger.requeue(r)
        self.preemptions += 1
