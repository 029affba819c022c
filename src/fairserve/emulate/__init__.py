"""`fairserve emulate`: an OpenAI-compatible server that is the simulated continuous-batching engine, in real time.

Simulated time follows wall time × `time_scale`; each token is streamed when the simulated engine produces it.
The emulator is an ordinary engine (default policy FCFS): fairness is the gateway's job.

Semantics worth knowing:
- Output: always exactly `max_tokens` tokens (chat: `max_completion_tokens`, else `max_tokens`; defaults 16 for
  completions, 256 for chat), each the text " tok", finish_reason "length". `ignore_eos` is accepted and changes
  nothing: the emulator behaves as if it were always true. Prompt tokens = `api.tokens.estimate_tokens` (>= 1).
- Model names: with `models` (`--model`, repeatable) and `loras` (`--lora`, adapters on the first model, listed
  with it as `parent`) named, only those are served (404 `model_not_found` for others; a request naming none gets
  the first); with none named, any `model` is accepted and echoed back and /v1/models lists "fairserve-emulated".
- Beyond completions and chat (`more_api`): /v1/embeddings (a prefill of all inputs, answered at its end; float or
  base64 vectors, deterministic per input), /v1/responses (streamed and not, `max_output_tokens` tokens, default
  256; `previous_response_id` and `background` refused with a 400), /tokenize and /detokenize (vLLM's shapes;
  reversible ids, `api.tokenize`; never reach the engine). Faults apply to completions and chat only.
- Client: the `X-Fairserve-Client` header names the engine-side client, else "anonymous".
- Errors are OpenAI-style JSON: 400 for malformed JSON, a non-object body, missing or invalid fields, `n` != 1,
  `stream_options` without `stream`, or a request that can never fit the KV pool; 429 if the engine's policy
  rejects it (rate-limiting policies only).
- Faults, decided per request at arrival by a `random.Random(seed)` (error beats hang beats drop):
  error: 500 (code "emulated_error") before any work. extra latency: the request reaches the engine
  `extra_latency_s` wall seconds late (so the first token, or the response, is that much later).
  drop: after max_tokens // 2 tokens the engine request is cancelled and the connection closed without the rest:
  a stream without `[DONE]` and without the chunked terminator; a non-stream gets a 200 whose Content-Length
  promises the whole body but only its first half arrives (clients raise a protocol/connection error).
  hang: the request runs in the engine but nothing (not even headers) is sent; when the client disconnects it is
  cancelled there.
- A client that disconnects has its request cancelled in the engine (streams at once; non-streams within 50 ms).
"""

from .app import create_app
from .config import EmulatorConfig, Fault
from .driver import OUTCOMES, Emulator, Job

__all__ = ["OUTCOMES", "Emulator", "EmulatorConfig", "Fault", "Job", "create_app"]
