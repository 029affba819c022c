"""VTC inside Hugging Face transformers' continuous batching (written against transformers 5.24).

`register(queue)` puts a `FairScheduler` subclass bound to an `EngineQueue` into transformers' `SCHEDULER_MAPPING`
and returns its name for `ContinuousBatchingConfig(scheduler_type=...)`. Each step it schedules, like transformers'
FIFO scheduler, the running requests first (decodes, then split prefills), and then admits waiting requests **in the
policy's order**, strictly: it stops at the first one that does not fit, so a client cannot overtake the client with
the smallest counter by being smaller. As in the paper's engine, it admits no more requests than one batch runs
(`max_requests_per_batch`), so every admitted request advances every step and the backlog waits where the policy
orders it.

Charging (through `EngineQueue`): the whole prompt at admission (the paper; refunded down to what was prefilled if
the request is cancelled mid-prefill), one output token per scheduled step that yields a token, and a reconciliation
to the tokens really generated when the request ends. Evict-and-recompute (transformers' "soft reset") and CPU
offload (off in `HFEngine`; possible for `register()` users, untested) call `finish_request(id)` and then
`add_waiting_request(state)` with the same id and a state marked as such: the finish is held back until the next
scheduling step, so such a request is re-queued (no lift, no second prompt charge) instead of being finished and
arriving anew. Parallel sampling (`num_return_sequences > 1`) is refused: transformers forks those requests straight
into the running set, past the scheduler.

Prefix caching: a prompt served partly from cached blocks is still charged in full (service is what the client
asked for, not what the engine saved).
"""

from __future__ import annotations

import itertools
import time

from transformers.generation.continuous_batching import scheduler as hf_scheduler
from transformers.generation.continuous_batching.requests import FutureRequestState, RequestState, RequestStatus

from .queue import EngineQueue

_names = itertools.count()


def register(queue: EngineQueue[RequestState]) -> str:
    """Register a scheduler bound to `queue`; returns its `scheduler_type` name. transformers silently falls back to
    FIFO on unknown names: check that the scheduler it instantiated is a `FairScheduler` (`HFEngine.start` does)."""
    name = f"fairserve-{next(_names)}"
    bound: type[FairScheduler] = type("BoundFairScheduler", (FairScheduler,), {"queue": queue})
    hf_scheduler.SCHEDULER_MAPPING[name] = bound
    return name


def unregister(name: str) -> None:
    hf_scheduler.SCHEDULER_MAPPING.pop(name, None)


def generated(state: RequestState) -> int:
    """Output tokens produced so far, counting those folded into the prompt by a soft reset."""
    folded = len(state.initial_tokens) - state._true_initial_tokens if state._true_initial_tokens else 0
    return folded + len(state.generated_tokens)


def prompt_length(state: RequestState) -> int:
    return state._true_initial_tokens or len(state.initial_tokens)


class FairScheduler(hf_scheduler.FIFOScheduler):
    queue: EngineQueue[RequestState]  # set by `register`

    def __init__(self, cache, safety_margin, max_requests_per_batch) -> None:  # noqa: ANN001 (transformers' types)
        self._ending: dict[str, RequestState] = {}
        super().__init__(cache, safety_margin, max_requests_per_batch)

    # ---- request life cycle -------------------------------------------------------------------------------------
    def add_waiting_request(self, state: RequestState) -> None:
        # NOTE: raising here makes transformers fail this one request with our message
        rid = state.request_id
        if state.num_children or "__child#" in rid:
            raise RuntimeError(
                "parallel sampling (num_return_sequences > 1) is not supported by the fairserve "
                "scheduler: its forked requests would bypass the policy"
            )
        ended = self._ending.pop(rid, None)
        if ended is not None and (state._true_initial_tokens or state.is_cpu_offloaded):
            self.queue.preempted(rid, state)  # evicted a moment ago (soft reset or offload): back, not anew
        else:
            if ended is not None:  # a finished request whose id is reused
                self.queue.finished(rid, generated(ended))
            if not self.queue.arrive(
                rid, state, prompt_length(state), max_tokens=state.max_new_tokens, now=time.monotonic()
            ):
                raise RuntimeError(f"the policy {self.queue.policy.name!r} rejected request {rid!r}")
        super().add_waiting_request(state)

    def finish_request(self, request_id: str) -> None:
        state = self.active_requests.get(request_id)
        super().finish_request(request_id)
        if state is not None:
            self._ending[request_id] = state

    def _finish_ended(self) -> None:
        """Finish, in the policy, the requests that ended and did not come back as evicted."""
        while self._ending:
            rid, state = self._ending.popitem()
            self.queue.finished(rid, generated(state))

    def clear_cancelled_requests(self) -> list[RequestState]:
        cancelled = super().clear_cancelled_requests()
        for state in cancelled:
            # the position reached in the KV cache bounds what was prefilled (a soft-reset request had all of it)
            prompt = prompt_length(state)
            prefilled = prompt if state._true_initial_tokens else min(prompt, state.position_offset)
            self.queue.cancelled(state.request_id, prefilled=prefilled, output_tokens=generated(state))
        return cancelled

    def has_pending_requests(self) -> bool:
        self._finish_ended()
        return super().has_pending_requests()

    def reset(self) -> None:
        super().reset()
        for state in self._ending.values():
            self.queue.finished(state.request_id, generated(state))
        self._ending = {}

    # ---- scheduling ---------------------------------------------------------------------------------------------
    def schedule_batch(
        self, token_budget: int, cache_budget: int
    ) -> tuple[list[FutureRequestState] | None, bool, int, int]:
        self._finish_ended()
        decoding = [s for s in self.active_requests.values() if s.status == RequestStatus.DECODING]
        prefilling = [s for s in self.active_requests.values() if s.status == RequestStatus.PREFILLING]
        left_waiting: set[str] = set()
        batch, failed, fast_path, num_q, max_kv = self._process_candidates(
            decoding + prefilling, token_budget, cache_budget, left_waiting
        )
        starved = self.starved_requests  # NOTE: each _process_candidates call resets it; keep the running ones'
        token_budget, cache_budget = token_budget - num_q, cache_budget - max_kv
        if not self.block_new_requests:
            new, new_failed, new_fast, new_q, new_kv = self._admit(batch, token_budget, cache_budget, left_waiting)
            batch += new
            failed |= new_failed
            fast_path &= new_fast
            num_q, max_kv = num_q + new_q, max_kv + new_kv
        self.starved_requests = starved
        self._cleanup_waiting_queue(left_waiting)
        for future in batch:
            if future.has_new_token:
                self.queue.output(future.state.request_id)
        if not batch and failed:
            return None, fast_path, 0, 0
        return batch, fast_path, num_q, max_kv

    def _admit(
        self, batch: list[FutureRequestState], token_budget: int, cache_budget: int, left_waiting: set[str]
    ) -> tuple[list[FutureRequestState], bool, bool, int, int]:
        """Admit waiting requests in policy order until one does not fit (or a budget runs out)."""
        new: list[FutureRequestState] = []
        failed, fast_path, num_q, max_kv = False, True, 0, 0
        margin_ok: bool | None = None
        # NOTE: admitted requests must all fit one batch: transformers decodes at most max_requests_per_batch a step,
        # oldest first, so admitting more (cheap with prefix sharing) would hand the order to arrival time, not VTC
        while token_budget > 0 and len(self.active_requests) < self.max_requests_per_batch:
            if (batch or new) and margin_ok is None:  # transformers' rule: under the safety margin, one new prefill
                margin_ok = self._try_to_meet_safety_margin()
            if margin_ok is False:
                break
            with self.queue.lock:  # NOTE: a counter reset or weight change must not reorder peek → pop
                state = self.queue.peek()
                if state is None:
                    break
                got, failed, fast, q, kv = self._process_candidates([state], token_budget, cache_budget, left_waiting)
                if state.request_id not in self.waiting_requests:  # scheduled, or made active by a prefix match
                    self.queue.pop()
            if not got:  # `failed` then says whether it failed for want of cache
                break
            new += got
            fast_path &= fast
            num_q, max_kv = num_q + q, max_kv + kv
            token_budget, cache_budget = token_budget - q, cache_budget - kv
        return new, failed, fast_path, num_q, max_kv
