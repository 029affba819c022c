"""vLLM's waiting queue in a fairserve policy's order (`VTCRequestQueue`): how vLLM's queue calls become the
ledger's life cycle, a request's tenant and priority at arrival, and the hold of the LoRA-slot rule
(`vllm_lora`). The scheduler subclass that installs it is `vllm_scheduler`.

How engine events become the paper's charges (`EngineQueue` does the policy calls):

    Scheduler.add_request -> waiting.add_request      arrive()     counter lift for a client with nothing queued
    waiting.pop_request (admission, or a skip)        pop()        prompt charged, once per request (the tokens
                                                                   vLLM's prefix cache serves priced at w_cached)
    waiting.prepend_request(s), popped in this pass   unpop()      back to the front of its client, no lift; the
      and not scheduled (vLLM's skip)                              admission charge refunded (charged at the next pop)
    waiting.prepend_request(s), preempted (it ran)    preempted()  back to the front of its client: no charge, no lift
    update_from_output (after vLLM appended tokens)   output()     the step's new output tokens (EOS/stop-token trimmed)
    _free_request (stopped, length, aborted, error)   finished() / cancelled(): reconciled to the tokens produced

vLLM (0.32 and 0.33) also keeps `kv_holding_waiting`, a queue of waiting requests that already hold KV blocks (async
KV loads, streaming-input sessions), drained before `waiting`. Everything in it was admitted (and charged) through
`waiting` or arrived holding blocks, so it stays vLLM's own queue: to VTC those requests are running.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..core import DEFAULT_TENANT, Ledger, Policy, TenantView
from .queue import CLIENT_ARG, EngineQueue
from .vllm_config import VTCConfig
from .vllm_prefix import cached_at_admission
from .vllm_tenants import DEFAULT_SOURCES, path_problem, tenant_of_request

logger = logging.getLogger(__name__)

_CANCEL_STATUSES = frozenset({"FINISHED_ABORTED", "FINISHED_ERROR"})  # charged only for what was done
MAX_HELD = 64  # requests held back in one pass (the LoRA-slot rule) at most: the rest of the queue waits a step
MAX_WARNED = 1000  # distinct tenants warned about, at most (a client can make up names)


# ---- what the policy needs to know of a vLLM request --------------------------------------------------------------
def prefilled_tokens(request: Any) -> int | None:
    """Prompt tokens a cancelled request really had prefilled; None: all of them (it was prefilled once already,
    before a preemption reset `num_computed_tokens`)."""
    if getattr(request, "num_preemptions", 0):
        return None
    return min(request.num_computed_tokens, request.num_prompt_tokens)


def _max_tokens(request: Any) -> int | None:
    value = getattr(request, "max_tokens", None)
    if value is None:
        value = getattr(getattr(request, "sampling_params", None), "max_tokens", None)
    return value if isinstance(value, int) else None


def _status_name(request: Any) -> str:
    status = request.status
    return getattr(status, "name", str(status))


def _never_ran(request: Any) -> bool:
    """A request put back that was never scheduled (a preempted one has status PREEMPTED and a preemption count)."""
    return not getattr(request, "num_preemptions", 0) and _status_name(request) not in ("RUNNING", "PREEMPTED")


# ---- the waiting queue ------------------------------------------------------------------------------------------
class VTCRequestQueue:
    """vLLM's `RequestQueue` interface over an `EngineQueue`: `peek_request`/`pop_request` follow the policy.

    `pop_request` admits the policy's next request and charges its prompt, as the paper does at admission. vLLM also
    pops requests only to skip them for this pass (grammar still compiling, LoRA slots full, 0.33: no token budget
    left for it) and puts them back at the end of the pass: such a request, never scheduled, goes back to the front
    of its client's queue with its admission charge refunded and no counter lift; it is charged when it is popped
    again. A preempted request (it ran) keeps its charges. `__iter__` is in no particular order.
    `remove_request(s)` is only used by vLLM for requests that end while waiting.

    A request whose tenant cannot be one (a malformed path, a group's name, a path through a tenant) is refused:
    `on_refused(request_id)` (the scheduler has vLLM fail it), else it is queued as the default tenant's."""

    def __init__(
        self,
        engine_queue: EngineQueue,
        client_key: str = CLIENT_ARG,
        tenant_from: tuple[str, ...] = DEFAULT_SOURCES,
        allowed_paths: Iterable[str] = (),
    ) -> None:
        self.engine_queue = engine_queue
        self.client_key = client_key
        self.tenant_from = tenant_from
        self.on_refused: Callable[[str], None] | None = None
        self.log = logger
        self._allowed_paths = frozenset(allowed_paths)  # FAIRSERVE_ALLOWED_PRIORITIES' tenants
        self._turns: dict[str, tuple[int, int]] = {}  # request id -> (outputs of earlier session turns, last count)
        self._fresh: set[str] = set()  # popped for a first admission in this pass, not yet seen scheduled
        # the pass's hold (the LoRA-slot rule): what it matches is popped here, never shown to vLLM, put back after
        self._hold: Callable[[Any], bool] | None = None
        self._closed = False  # for this pass: nothing is shown to vLLM (a step that preempted for memory)
        self._held: list[Any] = []
        self._pops: dict[str, int] = {}  # request id -> when it was popped in this pass (to put things back in order)
        self._clock = itertools.count()
        self._warned: set[str] = set()

    @classmethod
    def from_config(cls, config: VTCConfig) -> VTCRequestQueue:
        policy = config.make_policy()
        try:
            eq: EngineQueue = EngineQueue(
                policy, weights=config.weights, priorities=config.priorities, allowed=config.allowed
            )
        except ValueError as e:
            raise ValueError(f"FAIRSERVE_WEIGHTS / FAIRSERVE_PRIORITIES / FAIRSERVE_ALLOWED_PRIORITIES: {e}") from None
        return cls(eq, config.client_key, config.tenant_from, config.allowed or ())

    @property
    def policy(self) -> Policy:
        return self.engine_queue.policy

    @property
    def ledger(self) -> Ledger:
        return self.engine_queue.ledger

    def tenant_of(self, request: Any) -> str:
        return tenant_of_request(request, self.client_key, self.tenant_from)

    # ---- RequestQueue -------------------------------------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        if self.engine_queue.request(request.request_id) is not None:
            self._put_back(request)  # a streaming session's next turn, or any re-enqueue of a known request
            return
        self._arrive(request)

    def pop_request(self) -> Any:
        eq = self.engine_queue
        with eq.lock:
            head = self._head()
            if head is None:
                raise IndexError("pop from an empty queue")
            rid = head.request_id
            req = eq.request(rid)
            first = req is not None and not req.admitted
            item = eq.pop(cached_at_admission(head) if first else None)
            self._pops[rid] = next(self._clock)
            if first:
                self._fresh.add(rid)
            return item

    def peek_request(self) -> Any:
        item = self._head()
        if item is None:
            raise IndexError("peek from an empty queue")
        return item

    def prepend_request(self, request: Any) -> None:
        self._put_back(request, unpop=True)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        # each goes to the front of its client's queue, so the last given ends up first (as FCFS's extendleft)
        given = list(requests)
        if not self._held:
            for request in given:
                self._put_back(request, unpop=True)
            return
        with self.engine_queue.lock:  # with the held ones, in the reverse of the order they were popped in
            held, self._held = self._held, []
            ids = {r.request_id for r in held}
            for request in sorted(held + given, key=self._popped_at, reverse=True):
                if request.request_id in ids:
                    self.engine_queue.unpop(request.request_id, request)
                else:
                    self._put_back(request, unpop=True)

    def remove_request(self, request: Any) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Any]) -> None:
        for request in list(requests):
            rid = request.request_id
            if self._held and any(r.request_id == rid for r in self._held):
                self._release([r for r in self._held if r.request_id == rid])
            if rid in self.engine_queue:
                self.engine_queue.cancelled(rid, prefilled_tokens(request), self._outputs(request))
                self._forget(rid)

    def __bool__(self) -> bool:
        if self._closed:
            return False
        if self._hold is None:
            return len(self.engine_queue) > 0
        return self._head() is not None

    def __len__(self) -> int:
        return len(self.engine_queue)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.engine_queue)

    # ---- the pass (called by the scheduler) ---------------------------------------------------------------------
    def hold_back(self, held: Callable[[Any], bool]) -> None:
        """For this pass only, the requests `held` matches are not shown to vLLM (they keep their place)."""
        self._hold = held

    def hold_ids(self, ids: Iterable[str]) -> None:
        """For this pass only, also hold back the requests with these ids (preempted ones: not re-admitted at once)."""
        ids = frozenset(ids)
        if not ids:
            return
        before = self._hold
        self._hold = lambda r: r.request_id in ids or (before is not None and before(r))

    def close_pass(self) -> None:
        """For this pass only, show vLLM no waiting request."""
        self._closed = True

    def head(self) -> Any | None:
        """The request vLLM would be shown next in this pass (None: none)."""
        return None if self._closed else self._head()

    def end_pass(self) -> None:
        """vLLM's `schedule()` returned: what it popped this pass was scheduled or has been put back."""
        self._release(self._held)
        self._hold = None
        self._closed = False
        self._fresh.clear()
        self._pops.clear()

    def _head(self) -> Any | None:
        """The policy's next request, once the ones held back in this pass are out of the way."""
        eq = self.engine_queue
        if self._closed:
            return None
        with eq.lock:
            item = eq.peek()
            hold = self._hold
            while item is not None and hold is not None and hold(item):
                if len(self._held) >= MAX_HELD:
                    return None  # NOTE: the rest waits for the next pass, which keeps a pass's cost bounded
                eq.pop()
                self._pops[item.request_id] = next(self._clock)
                self._held.append(item)
                item = eq.peek()
            return item

    def _release(self, items: list[Any]) -> None:
        """Put held requests back where they were: as if never popped."""
        if not items:
            return
        with self.engine_queue.lock:
            for item in sorted(items, key=self._popped_at, reverse=True):
                self.engine_queue.unpop(item.request_id, item)
            self._held = [r for r in self._held if r not in items]

    def _popped_at(self, request: Any) -> int:
        return self._pops.get(request.request_id, -1)

    # ---- charging (called by the scheduler) ---------------------------------------------------------------------
    def charge_outputs(self, requests: Iterable[Any]) -> None:
        """Charge each request's output tokens not yet charged: after vLLM's `update_from_output` appended a step's
        sampled tokens (trimmed at a stop, rejected drafts excluded), that is exactly the step's new tokens."""
        eq = self.engine_queue
        for request in requests:
            if request is None:
                continue
            req = eq.request(request.request_id)
            if req is None:
                continue
            self._fresh.discard(request.request_id)
            if request.num_prompt_tokens > req.prompt_tokens:  # a streaming session's next turn
                eq.prompt(request.request_id, request.num_prompt_tokens)
            new = self._outputs(request) - req.output_done
            if new > 0:
                eq.output(request.request_id, new)

    def freed(self, request: Any) -> None:
        """vLLM freed `request` (finished, aborted or failed): reconcile its account to what it really used."""
        rid = request.request_id
        if self.engine_queue.request(rid) is None:
            return
        outputs = self._outputs(request)
        self._forget(rid)
        if _status_name(request) in _CANCEL_STATUSES:
            self.engine_queue.cancelled(rid, prefilled_tokens(request), outputs)
        else:
            self.engine_queue.finished(rid, outputs)

    def _outputs(self, request: Any) -> int:
        """Output tokens produced so far. A streaming-input session's next turn restarts vLLM's count
        (`_update_request_as_session` clears the outputs and grows the prompt): earlier turns' outputs are kept."""
        rid, produced = request.request_id, request.num_output_tokens
        base, last = self._turns.get(rid, (0, 0))
        if produced < last:
            base += last
        if base or produced:
            self._turns[rid] = (base, produced)
        return base + produced

    def accounts(self) -> dict[str, TenantView]:
        return self.engine_queue.accounts()

    def _forget(self, rid: str) -> None:
        self._turns.pop(rid, None)
        self._fresh.discard(rid)

    # ---- arrivals -----------------------------------------------------------------------------------------------
    def _arrive(self, request: Any) -> None:
        """Queue a request new to the ledger, as its tenant's, at the priority the core's rule gives it."""
        rid, eq = request.request_id, self.engine_queue
        tenant = self.tenant_of(request)
        named = getattr(request, "priority", None)
        named = named if isinstance(named, int) and not isinstance(named, bool) else None
        new = tenant not in eq.ledger.accounts
        problem = path_problem(tenant)
        try:
            if problem is not None:
                raise ValueError(problem)
            accepted = eq.arrive(
                rid,
                request,
                request.num_prompt_tokens,
                client=tenant,
                max_tokens=_max_tokens(request),
                now=float(getattr(request, "arrival_time", 0.0) or 0.0),
                priority=named,
            )
        except ValueError as e:
            self._refuse(request, tenant, str(e))
            return
        if not accepted:  # VTCConfig refuses rejecting policies; a custom one must not reject either
            raise RuntimeError(f"policy {self.policy.name!r} rejected request {rid!r}")
        req = eq.request(rid)
        level = req.priority if req is not None else None
        if level is not None and named is not None and named != level:
            # NOTE: vLLM picks preemption victims (and orders kv_holding_waiting) by this: the level it runs at
            request.priority = level
            self._warn_once(
                "priority",
                "fairserve: tenant %r named priority %d, not among those it may name (FAIRSERVE_ALLOWED_PRIORITIES): "
                "its requests run at %d (said once)",
                tenant,
                named,
                level,
            )
        if new and self._allowed_paths:
            parts = tenant.split("/")
            for k in range(1, len(parts)):
                group = "/".join(parts[:k])
                if group in self._allowed_paths:
                    self._warn_once(
                        "group:" + group,
                        "fairserve: FAIRSERVE_ALLOWED_PRIORITIES names %r, which is now a group (tenant %r is below "
                        "it): allowed priorities are per tenant, so it allows nothing",
                        group,
                        tenant,
                    )

    def _refuse(self, request: Any, tenant: str, reason: str) -> None:
        rid = request.request_id
        if self.on_refused is not None:
            self._warn_once(
                "tenant:" + tenant, "fairserve: request %s failed: tenant %r cannot be used: %s", rid, tenant, reason
            )
            self.on_refused(rid)
            return
        self._warn_once(
            "tenant:" + tenant,
            "fairserve: request %s: tenant %r cannot be used (%s): queued as %r",
            rid,
            tenant,
            reason,
            DEFAULT_TENANT,
        )
        self.engine_queue.arrive(
            rid, request, request.num_prompt_tokens, client=DEFAULT_TENANT, max_tokens=_max_tokens(request)
        )

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned and len(self._warned) < MAX_WARNED:
            self._warned.add(key)
            self.log.warning(message, *args)

    def _put_back(self, request: Any, unpop: bool = False) -> None:
        rid = request.request_id
        eq = self.engine_queue
        with eq.lock:
            if unpop and rid in self._fresh and _never_ran(request):
                self._fresh.discard(rid)  # popped in this pass and skipped: as if never popped
                eq.unpop(rid, request)
                return
            if eq.preempted(rid, request) or rid in eq:
                return
        # unknown here: it reached vLLM's queues without passing ours (e.g. a session that arrived holding blocks)
        self._arrive(request)
