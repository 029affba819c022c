"""Which tenant a vLLM request belongs to. A request names it in one of three places, tried in the order of
`FAIRSERVE_TENANT_FROM` (default `xargs,lora,id`); the first that names one wins, else the default tenant:

    xargs   `SamplingParams.extra_args[FAIRSERVE_CLIENT_KEY]` (OpenAI: `"vllm_xargs": {"fairserve_client": ...}`)
    lora    the name of the request's LoRA adapter (`lora_request.lora_name`): each adapter is a tenant, as in
            the paper's S-LoRA setting
    id      the request id's prefix, `<tenant>::<rest>` (`engines.queue.request_id_for`)

A tenant is a path (`pro/acme/search`: the tenant `search` in the groups `pro/acme` and `pro`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import DEFAULT_TENANT
from .queue import CLIENT_ARG, CLIENT_SEP

SOURCES = ("xargs", "lora", "id")
DEFAULT_SOURCES = SOURCES
MAX_DEPTH, MAX_LENGTH = 16, 256  # NOTE: every charge walks the path: a client must not make it arbitrarily deep


def parse_sources(text: str, source: str) -> tuple[str, ...]:
    """`xargs,lora,id` or any ordered subset; the default order for no text."""
    if not text:
        return DEFAULT_SOURCES
    names = tuple(x.strip() for x in text.split(","))
    bad = [n for n in names if n not in SOURCES]
    if bad or len(set(names)) != len(names):
        raise ValueError(
            f"bad {source} {text!r}: expected some of {', '.join(SOURCES)} in the order to try them, each once"
        )
    return names


def _from_xargs(request: Any, key: str) -> str | None:
    params = getattr(request, "sampling_params", None)
    extra = getattr(params, "extra_args", None) if params is not None else None
    if isinstance(extra, Mapping):
        name = extra.get(key)
        if name is not None and str(name).strip():
            return str(name).strip()
    return None


def _from_lora(request: Any, key: str) -> str | None:
    lora = getattr(request, "lora_request", None)
    name = getattr(lora, "lora_name", None) if lora is not None else None
    return (name.strip() or None) if isinstance(name, str) else None


def _from_id(request: Any, key: str) -> str | None:
    name, sep, _ = str(request.request_id).partition(CLIENT_SEP)
    return name if sep and name else None


_FROM = {"xargs": _from_xargs, "lora": _from_lora, "id": _from_id}


def tenant_of_request(request: Any, key: str = CLIENT_ARG, sources: tuple[str, ...] = DEFAULT_SOURCES) -> str:
    """The tenant named by the first of `sources` that names one, else the default tenant."""
    for source in sources:
        name = _FROM[source](request, key)
        if name is not None:
            return name
    return DEFAULT_TENANT


def path_problem(tenant: str) -> str | None:
    """Why `tenant` is not a well-formed tenant path, or None."""
    if len(tenant) > MAX_LENGTH:
        return f"longer than {MAX_LENGTH} characters"
    parts = tenant.split("/")
    if any(not p.strip() for p in parts):
        return "an empty part (a leading, trailing or double slash)"
    if len(parts) > MAX_DEPTH:
        return f"deeper than {MAX_DEPTH} levels"
    if len(parts) > 1 and parts[0] == DEFAULT_TENANT:  # NOTE: else one such request fails all that name no tenant
        return f"below the default tenant {DEFAULT_TENANT!r}, which cannot be a group"
    return None
