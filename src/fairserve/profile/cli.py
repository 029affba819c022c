"""`fairserve profile`: measure an engine, write its profile file, print the fit and its error per row."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..argtypes import positive
from .grid import BATCHES, OUTPUT, PROMPTS

SUMMARY = "measure an engine's step times and write a profile file for --profile"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "profile",
        help=SUMMARY,
        description=SUMMARY + ". vLLM in-process (--engine vllm, exact: each engine step timed) or any OpenAI-"
        "compatible server through HTTP (--engine http, from streamed tokens: less exact, docs/latency.md).",
    )
    p.add_argument("--engine", choices=("vllm", "http"), required=True)
    p.add_argument("--out", required=True, metavar="FILE", help="the profile file to write (JSON)")
    p.add_argument("--model", metavar="PATH|NAME", help="vllm: the model directory; http: the model name to send")
    p.add_argument("--url", help="http: the server's base URL")
    p.add_argument("--api-key", metavar="KEY", help="http: a Bearer key, if the server asks for one")
    p.add_argument("--repeats", type=positive(int, "a whole number"), default=3, metavar="N", help="per row (3)")
    p.add_argument("--max-num-seqs", type=positive(int, "a whole number"), metavar="N", help="the engine's batch cap")
    p.add_argument("--max-batched-tokens", type=positive(int, "a whole number"), metavar="N")
    p.add_argument("--kv-tokens", type=positive(int, "a whole number"), metavar="N", help="http: the server's pool")
    p.add_argument(
        "--prompts", type=_sizes, default=PROMPTS, metavar="N,N,...", help=f"prompt lengths {_show(PROMPTS)}"
    )
    p.add_argument("--batches", type=_sizes, default=BATCHES, metavar="N,N,...", help=f"batch sizes {_show(BATCHES)}")
    p.add_argument(
        "--output",
        type=positive(int, "a whole number"),
        default=OUTPUT,
        metavar="N",
        help=f"tokens per request ({OUTPUT})",
    )
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="vllm: an LLM(...) argument (VALUE as JSON when it parses, else text), e.g. max_model_len=1024",
    )


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1 separated by commas, got {text!r}")
    return sizes


def _show(sizes: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, sizes)) + ")"


def _engine_args(pairs: list[str], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--engine-arg {pair!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            out[key.strip()] = text
    if args.max_num_seqs is not None:
        out["max_num_seqs"] = args.max_num_seqs
    if args.max_batched_tokens is not None:
        out["max_num_batched_tokens"] = args.max_batched_tokens
    return out


def shape_of(args: argparse.Namespace) -> dict[str, Any]:
    """The grid's flags, as `grid.grid` takes them."""
    return {"prompts": args.prompts, "batches": args.batches, "output": args.output}


def run(args: argparse.Namespace) -> int:
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.engine == "vllm":
        if not args.model:
            raise ValueError("--engine vllm needs --model PATH")
        engine_args = _engine_args(args.engine_arg, args)
        from . import vllm

        try:
            prof = vllm.profile(args.model, engine_args, args.repeats, log, shape_of(args))
        except ImportError as e:
            raise ValueError(f"--engine vllm needs vLLM installed: {e}") from None
    else:
        if not args.url or not args.kv_tokens or not args.max_num_seqs:
            raise ValueError("--engine http needs --url, --kv-tokens and --max-num-seqs (not visible through HTTP)")
        import httpx

        from . import http

        try:
            prof = http.profile(
                args.url.rstrip("/"),
                args.model or "default",
                args.kv_tokens,
                args.max_num_seqs,
                args.max_batched_tokens,
                args.repeats,
                args.api_key,
                log,
                shape_of(args),
            )
        except httpx.TransportError as e:
            raise ValueError(f"{args.url}: {e or type(e).__name__}") from None
        except RuntimeError as e:
            print(f"fairserve profile: error: {e}", file=sys.stderr)
            return 1
    Path(args.out).write_text(json.dumps(prof.to_dict(), indent=1) + "\n")
    print_fit(prof, args.out)
    return 0


def print_fit(prof: Any, path: str) -> None:
    fit = prof.latency()
    print(f"wrote {path}: {len(prof.rows)} rows, KV pool {prof.kv_tokens:,} tokens")
    print(
        f"fitted: prefill {fit.prefill_fixed_s * 1e3:.3f} ms + {fit.prefill_per_token_s * 1e6:.3f} µs/token "
        f"(+ {fit.prefill_per_sq_token_s * 1e9:.4f} ns/token²); decode step {fit.decode_fixed_s * 1e3:.3f} ms + "
        f"{fit.decode_per_seq_s * 1e6:.2f} µs/request + {fit.decode_per_context_token_s * 1e9:.2f} ns/context token"
    )
    print("| prompt | batch | prefill ms | fit | err | decode step ms | fit | err |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for e in prof.errors():
        pre = (
            f"{e['prefill_s'] * 1e3:.2f} | {e['prefill_model_s'] * 1e3:.2f} | {e['prefill_err']:+.1%}"
            if e["prefill_fitted"]
            else "| | (not measured)"
        )
        dec = (
            f"{e['decode_step_s'] * 1e3:.2f} | {e['decode_model_s'] * 1e3:.2f} | {e['decode_err']:+.1%}"
            if e["decode_fitted"]
            else "| | (not measured)"
        )
        print(f"| {e['prompt_len']} | {e['batch_size']} | {pre} | {dec} |")
    print(f"use it: fairserve simulate --profile {path} --engine-mode vllm ... (its pool is the default --kv-tokens)")
