"""A transformers continuous-batching engine driven by a fairserve policy, with an asyncio front for servers.

    HFEngine(model, tokenizer, policy, EngineSizing(...))
    engine.start()                      # the generation thread; checks transformers really uses our scheduler
    async for out in engine.generate(client, input_ids, max_new_tokens): ...   # GenerationOutput per step
    engine.stop()                       # joins the thread (otherwise the process hangs at exit)

`policy=None` runs transformers' own FIFO scheduler (no accounts): the baseline of the benchmarks.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from transformers import ContinuousBatchingConfig, GenerationConfig
from transformers.generation.continuous_batching.requests import GenerationOutput, RequestStatus

from ..core import Policy, TenantView
from .hf_scheduler import FairScheduler, register, unregister
from .queue import EngineQueue, request_id_for

log = logging.getLogger("fairserve.engine")

START_TIMEOUT_S = 60.0
LIVENESS_POLL_S = 1.0  # how often a waiting request checks that the generation thread is alive


class EngineError(RuntimeError):
    """The engine failed a request."""


class EngineStopped(EngineError):
    """The engine is not running (it failed earlier, or is stopping): it did not take the request."""


@dataclass(frozen=True)
class EngineSizing:
    """Explicit KV-cache and batch sizes: left on auto, transformers sizes a CPU cache at 60% of RAM.
    The KV pool holds `num_blocks × page_size` tokens (the paper's M)."""

    num_blocks: int = 512
    page_size: int = 32
    max_batch_tokens: int = 512
    max_requests_per_batch: int = 64

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.page_size

    def validate(self) -> EngineSizing:
        for name in ("num_blocks", "page_size", "max_batch_tokens", "max_requests_per_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.page_size < 4:
            raise ValueError(f"page_size must be >= 4 (transformers' minimum), got {self.page_size}")
        return self


class _Latest:
    """The newest output of one request. Outputs are cumulative, so a slow reader skips intermediate ones instead of
    queueing copies of a growing token list."""

    def __init__(self) -> None:
        self.out: GenerationOutput | None = None
        self.ready = asyncio.Event()

    def put(self, out: GenerationOutput) -> None:
        self.out = out
        self.ready.set()

    async def get(self, timeout_s: float) -> GenerationOutput | None:
        try:
            # NOTE: not asyncio.wait_for, which on Python 3.11 drops a cancel that lands as the output arrives
            async with asyncio.timeout(timeout_s):
                await self.ready.wait()
        except TimeoutError:
            return None
        self.ready.clear()
        out, self.out = self.out, None
        return out


class HFEngine:
    def __init__(
        self,
        model,
        tokenizer,
        policy: Policy | None,  # noqa: ANN001
        sizing: EngineSizing | None = None,
        tenants: tuple[str, ...] = (),
        weights: Mapping[str, float] | None = None,
        priorities: Mapping[str, int] | None = None,
        allowed: Mapping[str, Iterable[int]] | None = None,
    ) -> None:
        """`weights`, `priorities` by node path of the tenant tree; `allowed`: by tenant, the priorities its
        requests may name (`core.Ledger`)."""
        self.model, self.tokenizer = model, tokenizer
        self.sizing = (sizing or EngineSizing()).validate()
        self.queue: EngineQueue | None = (
            EngineQueue(policy, tenants, weights, priorities, allowed) if policy is not None else None
        )
        eos = tokenizer.eos_token_id if tokenizer is not None else None
        self.eos_token_id = eos if eos is not None else getattr(model.config, "eos_token_id", None)
        # NOTE: every request passes its own max_new_tokens
        self.generation_config = GenerationConfig(
            do_sample=False,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.eos_token_id if self.eos_token_id is not None else 0,
        )
        self._scheduler_name: str | None = None
        self.manager: Any = None  # transformers' ContinuousBatchingManager, once started

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        s = self.sizing
        if self.queue is not None:
            self._scheduler_name = register(self.queue)
        cb = ContinuousBatchingConfig(
            scheduler_type=self._scheduler_name or "fifo",
            num_blocks=s.num_blocks,
            page_size=s.page_size,
            max_batch_tokens=s.max_batch_tokens,
            max_requests_per_batch=s.max_requests_per_batch,
            use_async_batching=False,
            cpu_offload_space=0.0,
        )
        self.manager = self.model.init_continuous_batching(
            generation_config=self.generation_config, continuous_batching_config=cb
        )
        self.manager.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.manager.batch_processor is None and self.manager.is_running() and time.monotonic() < deadline:
            time.sleep(0.005)
        processor = self.manager.batch_processor
        if processor is None:
            why = self.failure()
            self.stop()
            raise EngineError(f"the engine did not start: {why or 'timed out'}")
        if self.queue is not None and not isinstance(processor.scheduler, FairScheduler):
            self.stop()
            raise EngineError(
                f"transformers runs {type(processor.scheduler).__name__}, not the fairserve scheduler "
                "(it falls back to FIFO on unknown names): this transformers version is not supported"
            )

    def stop(self) -> None:
        if self.manager is not None:
            self.manager.stop(block=True, timeout=30)
            self.manager = None
        if self.queue is not None and (left := self.queue.abandon_all()):
            log.warning("%d requests were still in the engine when it stopped", left)
        if self._scheduler_name is not None:
            unregister(self._scheduler_name)
            self._scheduler_name = None

    @property
    def running(self) -> bool:
        return self.manager is not None and self.manager.is_running()

    def failure(self) -> str | None:
        """Why the generation thread stopped, if it did."""
        if self.manager is None:
            return "the engine is not started"
        error = self.manager.background_thread_status.fatal_error
        if error is not None:
            return f"the generation loop failed: {error}"
        return None if self.manager.is_running() else "the generation loop has stopped"

    # ---- requests -----------------------------------------------------------------------------------------------
    async def generate(
        self,
        client: str,
        input_ids: list[int],
        max_new_tokens: int,
        ignore_eos: bool = False,
        stream: bool = True,
        priority: int | None = None,
    ) -> AsyncIterator[GenerationOutput]:
        """The request's latest output (its `generated_tokens` are cumulative) whenever the engine produced more,
        or only the final one with `stream=False`; the last one `is_finished()`. `priority`: the one the request
        names (the ledger runs it at that level if its tenant may name it). Closing the iterator early cancels
        the request in the engine. Raises EngineStopped if the engine did not take it, EngineError if it failed."""
        if (why := self.failure()) is not None:
            raise EngineStopped(why)
        mgr = self.manager
        rid = request_id_for(client, uuid.uuid4().hex)
        latest = _Latest()
        mgr.register_result_handler(rid, latest.put)
        done = False
        if priority is not None and self.queue is not None:
            with self.queue.lock:
                self.queue.named[rid] = priority
        try:
            # NOTE: called inline (the input queue is unbounded, so this never blocks) to keep arrival order
            added = mgr.add_request(
                input_ids,
                request_id=rid,
                max_new_tokens=max_new_tokens,
                streaming=stream,
                eos_token_id=-1 if ignore_eos or self.eos_token_id is None else self.eos_token_id,
            )
            if added is None:  # stopping: wait for the reason (a crash records it just after failing requests)
                raise EngineStopped(await self._reason_to_stop())
            while True:
                out = await latest.get(LIVENESS_POLL_S)
                if out is None:
                    if (why := self.failure()) is not None:
                        raise EngineError(why)
                    continue
                if out.status == RequestStatus.FAILED:
                    done = True
                    raise EngineError(f"the engine failed this request: {out.error}")
                done = out.is_finished()
                yield out
                if done:
                    return
        finally:
            if self.queue is not None and priority is not None:
                with self.queue.lock:
                    self.queue.named.pop(rid, None)  # NOTE: left only if the engine never took the request
            if not done:
                with mgr.output_router._lock:  # NOTE: transformers drops handlers only for finished requests
                    mgr.output_router.result_handlers.pop(rid, None)
                mgr.cancel_request(rid)

    async def _reason_to_stop(self, timeout_s: float = 5.0) -> str:
        deadline = time.monotonic() + timeout_s
        while (why := self.failure()) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return why or "the engine is not accepting requests"

    # ---- accounts -----------------------------------------------------------------------------------------------
    def accounts(self) -> dict[str, TenantView]:
        return self.queue.accounts() if self.queue is not None else {}
