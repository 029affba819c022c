"""Preemption inside vLLM (docs/vllm.md, "Preemption"): the policy spec's options `victim=counter|vllm`,
`preempt-priority=1`, `preempt=DELTA` and `preempt-max=K`, run by the scheduler before each of vLLM's scheduling
passes (`Preemptor.before_pass`), through vLLM's own preemption path: the request leaves `running` and goes
through `Scheduler._preempt_request` (its KV blocks freed, recompute, back to the waiting queue, where the ledger's
`requeue` keeps its charges). The victims are the core's rules (core/preemption.py), the same the simulator runs.

- **Victims by counter** (`victim=counter`, the default with a policy that keeps counters): before vLLM schedules its
  running requests, the KV blocks they need this step are counted; if the pool cannot give them, the plugin preempts
  in the core's `victim_order` (the worst level, the highest counter, the newest) until it can, and admits nothing
  else in that step (as vLLM does after a preemption). Where the count falls short of what vLLM then allocates
  (prefix-cache blocks shared with others, sliding-window or hybrid models, speculative tokens), vLLM's own rule
  picks the rest inside its `schedule()`: `max(running, key=(priority, arrival_time))` under
  `--scheduling-policy priority`, the request admitted last under `fcfs`.
- **Priority that preempts** (`preempt-priority=1`) and **fairness-triggered preemption** (`preempt=DELTA`): when the
  policy's next waiting request does not fit (the batch is at `max_num_seqs`, or the pool has fewer free blocks than
  its first chunk and the running requests' next tokens need), the plugin preempts `priority_victims` (running
  requests of a worse level) or else `fair_victims` (running requests of its own level whose tenant's counter
  exceeds its tenant's by more than DELTA), as few as make it fit, and vLLM admits it in the same pass. A request is
  preempted by these two rules at most K times (`preempt-max`, default 1); equal levels never preempt each other
  for priority. The victims are held back for that pass.

What it relies on in vLLM (0.32; pinned by tests_vllm/test_preemption.py): `Scheduler.running` is the list of
running requests in admission order, `_preempt_request(request, timestamp)` preempts one that has left it,
`max_num_running_reqs`, `max_num_scheduled_tokens`, `block_size`, and the KV-cache manager's
`block_pool.get_num_free_blocks()`, `get_block_ids(request_id)` and `watermark_blocks`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.preemption import fair_victims, priority_victims, victim_order
from .vllm_config import PreemptOptions
from .vllm_queue import VTCRequestQueue

# what the plugin calls on vLLM's scheduler (pinned by tests_vllm/test_preemption.py)
NEEDS = (
    "running",
    "_preempt_request",
    "kv_cache_manager",
    "max_num_running_reqs",
    "max_num_scheduled_tokens",
    "block_size",
)


@dataclass(eq=False)
class Running:
    """A running request as the core's rules see it."""

    request: Any
    tenant: str
    level: int
    fair_preemptions: int  # preemptions by the priority and fairness rules so far (bounded by preempt-max)
    held: int  # KV blocks it holds
    need: int  # KV blocks its next step allocates


@dataclass
class Counts:
    for_memory: int = 0  # requests the plugin preempted for memory, by counter
    for_priority: int = 0  # for a waiting request of a better level
    for_fairness: int = 0  # for a waiting request of a tenant DELTA below


@dataclass
class Preemptor:
    options: PreemptOptions
    queue: VTCRequestQueue
    counts: Counts = field(default_factory=Counts)
    times: dict[str, int] = field(default_factory=dict)  # request id -> preemptions by the admission rules

    def check(self, sched: Any, log: logging.Logger) -> None:
        """At start: the scheduler has what the plugin calls (another vLLM may not). Without it, preemption for a
        waiting request is refused (RuntimeError) and victims by counter fall back to vLLM's rule, with a warning."""
        missing = [name for name in NEEDS if not hasattr(sched, name)]
        if not missing:
            return
        if self.options.admits:
            raise RuntimeError(f"fairserve: preemption needs vLLM's Scheduler.{', .'.join(missing)}, not found here")
        if self.options.victim_by_counter:
            log.warning("fairserve: victim=counter needs vLLM's Scheduler.%s: vLLM's rule picks victims", missing[0])
            self.options = replace(self.options, victim_by_counter=False)

    def forget(self, request_id: str) -> None:
        self.times.pop(request_id, None)

    def before_pass(self, sched: Any) -> None:
        """Preempt what the options say, before vLLM's `schedule()` runs."""
        if not sched.running or not (self.options.victim_by_counter or self.options.admits):
            return
        kv = sched.kv_cache_manager
        free = kv.block_pool.get_num_free_blocks()
        # NOTE: a step's requests need at most its token budget in blocks, and two partial blocks each: with that
        # much free no memory can run short, and only a head that may preempt needs the running set (an O(1) pass)
        if not self.options.admits and free > sched.max_num_scheduled_tokens // sched.block_size + 2 * len(
            sched.running
        ):
            return
        running = self._running(sched)
        need = sum(r.need for r in running)
        now = time.monotonic()
        if self.options.victim_by_counter and need > free:
            victims: list[Running] = []
            for r in victim_order(running, self.queue.ledger.accounts):
                if need <= free or len(victims) == len(running) - 1:
                    break  # NOTE: the last one left is vLLM's to handle (it preempts it, or it runs alone)
                victims.append(r)
                need -= r.need
                free += r.held
            if victims:
                self.counts.for_memory += len(victims)
                self._evict(sched, victims, now, count=False)
                self.queue.close_pass()  # as vLLM: no admission in a step that preempted
                return
        if self.options.admits:
            self._for_head(sched, running, free - need, now)

    def _for_head(self, sched: Any, running: list[Running], spare: int, now: float) -> None:
        """Preempt for the policy's next request if it does not fit and the rules allow."""
        item = self.queue.head()
        if item is None:
            return
        req = self.queue.engine_queue.request(item.request_id)
        if req is None:
            return
        slots = getattr(sched, "max_num_active_reqs", sched.max_num_running_reqs)
        tokens = min(item.num_tokens, sched.max_num_scheduled_tokens)
        head_need = -(-tokens // sched.block_size) + getattr(sched.kv_cache_manager, "watermark_blocks", 0)
        head = Running(item, req.tenant, req.priority or 0, 0, 0, head_need)

        def fits(h: Running, without: list[Running]) -> bool:
            room = len(running) - len(without) < slots
            return room and spare + sum(r.held + r.need for r in without) >= h.need

        if fits(head, []):
            return
        accounts = self.queue.ledger.accounts
        victims: list[Running] = []
        if self.options.priority:
            victims = priority_victims(head, running, accounts, self.options.preempt_max, fits)
            self.counts.for_priority += len(victims)
        if not victims and self.options.delta is not None:
            level = [r for r in running if r.level == head.level]
            victims = fair_victims(head, level, accounts, self.options.delta, self.options.preempt_max, fits)
            self.counts.for_fairness += len(victims)
        if victims:
            self._evict(sched, victims, now, count=True)

    def _running(self, sched: Any) -> list[Running]:
        """vLLM's running requests (admission order), with the blocks each holds and needs for its next step."""
        kv, size = sched.kv_cache_manager, sched.block_size
        budget = sched.max_num_scheduled_tokens
        eq = self.queue.engine_queue
        out = []
        for request in sched.running:
            rid = request.request_id
            req = eq.request(rid)
            held = len(kv.get_block_ids(rid)[0])
            tokens = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
            tokens = max(0, min(tokens, budget))
            budget -= tokens
            need = max(0, -(-(request.num_computed_tokens + tokens) // size) - held) if tokens else 0
            tenant = req.tenant if req is not None else ""
            level = (req.priority or 0) if req is not None else 0
            out.append(Running(request, tenant, level, self.times.get(rid, 0), held, need))
        return out

    def _evict(self, sched: Any, victims: list[Running], now: float, count: bool) -> None:
        """Through vLLM's own path: out of `running`, then `_preempt_request` (blocks freed, back to the waiting
        queue, which re-queues it in the ledger with its charges). Held back for the rest of this pass."""
        can_free = getattr(sched, "_request_blocks_can_be_freed", None)
        held = set()
        for v in victims:
            request = v.request
            if can_free is not None and not can_free(request):
                continue  # NOTE: a connector's deferred free: preempting would not give its blocks back now
            sched.running.remove(request)
            sched._preempt_request(request, now)
            if count:
                self.times[request.request_id] = self.times.get(request.request_id, 0) + 1
            held.add(request.request_id)
        self.queue.hold_ids(held)
