"""VTC inside real inference engines. `queue.EngineQueue` is the engine-agnostic glue; `hf` plugs it into Hugging Face
transformers' continuous batching, `vllm_scheduler` into vLLM's v1 scheduler. Engine imports stay inside those
modules, so `fairserve.engines` imports without either engine installed."""

from .queue import CLIENT_SEP, EngineQueue, client_of, request_id_for

__all__ = ["CLIENT_SEP", "EngineQueue", "client_of", "request_id_for"]
