"""Small fakes of vLLM 0.33's Request and RequestStatus for the main suite, which runs without vLLM (tests_vllm/ runs
the real engine, vLLM 0.32's CPU build), shared by the vLLM tests."""

from __future__ import annotations

import enum
from types import SimpleNamespace

from fairserve.engines.vllm_scheduler import CLIENT_ARG, VTCConfig, VTCRequestQueue


class Status(enum.IntEnum):  # the names vLLM's RequestStatus uses
    WAITING = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7


class FakeRequest:
    """The fields of vllm.v1.request.Request the integration reads."""

    def __init__(
        self,
        rid: str,
        client: str | None = None,
        prompt: int = 10,
        max_tokens: int = 4,
        extra_args: dict | None = None,
        priority: int = 0,
        lora: tuple[str, int] | None = None,
    ) -> None:
        self.request_id = rid
        args = dict(extra_args or {})
        if client is not None:
            args[CLIENT_ARG] = client
        self.sampling_params = SimpleNamespace(extra_args=args or None, max_tokens=max_tokens)
        self.num_prompt_tokens = prompt
        self.max_tokens = max_tokens
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.arrival_time = 0.0
        self.status = Status.WAITING
        self.priority = priority  # vLLM's: 0 unless the client names another
        self.lora_request = None if lora is None else SimpleNamespace(lora_name=lora[0], lora_int_id=lora[1])
        self._output_token_ids: list[int] = []

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def is_finished(self) -> bool:
        return self.status >= Status.FINISHED_STOPPED

    def __repr__(self) -> str:
        return f"<{self.request_id}>"


def make_queue(**config) -> VTCRequestQueue:
    return VTCRequestQueue.from_config(VTCConfig(**config))


def service(q: VTCRequestQueue) -> dict[str, float]:
    return dict(q.ledger.service)
