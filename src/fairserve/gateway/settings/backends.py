"""A backend's keys (`[[backends]]`, `--backend URL,max_requests=N,...`) and a model's price (`prices."MODEL"`)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field, field_validator, model_validator

from ...api.config import Strict
from ...tenancy import MAX_COST
from .urls import HTTP_URL, checked_url, has_credentials, redact


class BackendConfig(Strict):
    url: str
    # NOTE: `max_requests` / `max_tokens`, the flag's names (`--backend URL,max_requests=N`), work in TOML too
    max_inflight_requests: int = Field(32, ge=1, validation_alias=AliasChoices("max_inflight_requests", "max_requests"))
    max_inflight_tokens: int | None = Field(
        None, ge=1, validation_alias=AliasChoices("max_inflight_tokens", "max_tokens")
    )  # prompt + max_tokens of the requests in flight
    api_key: str | None = None  # sent upstream as `Authorization: Bearer`
    adaptive: bool = False  # limit in-flight requests from the backend's /metrics
    metrics_url: str | None = None  # default: URL/metrics (gateway/dispatch/capacity.py)
    engine_tenant: bool = False  # name the tenant to the engine (vLLM with VTCScheduler)
    # the model ids it serves; empty: those it lists at /v1/models (gateway/dispatch/pools.py)
    models: list[str] = Field(default_factory=list, max_length=1024)

    @property
    def name(self) -> str:
        """The URL without credentials: what `/healthz`, `/metrics` labels, logs and error messages show."""
        return redact(self.url)

    @model_validator(mode="after")
    def _one_auth(self) -> BackendConfig:
        if self.api_key is not None and has_credentials(self.url):
            raise ValueError(
                f"backend {self.name}: give either credentials in the URL (Basic auth) or api_key (Bearer), not both"
            )
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = checked_url(v.rstrip(), HTTP_URL, "an http(s) URL like http://127.0.0.1:8000").rstrip("/")
        return v[: -len("/v1")] if v.endswith("/v1") else v

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url(cls, v: str | None) -> str | None:
        return checked_url(v, HTTP_URL, "an http(s) URL like http://127.0.0.1:8000/metrics") if v is not None else None


class Price(Strict):
    """A model's cost of a prompt and an output token (`prices."llama-70b" = { w_p = 4, w_q = 8 }`)."""

    w_p: float = Field(1.0, ge=0, le=MAX_COST, allow_inf_nan=False)
    w_q: float = Field(2.0, ge=0, le=MAX_COST, allow_inf_nan=False)


BACKEND_OPTIONS = {
    "max_requests": "max_inflight_requests",
    "max_tokens": "max_inflight_tokens",
    "api_key": "api_key",
    "adaptive": "adaptive",
    "metrics_url": "metrics_url",
    "engine_tenant": "engine_tenant",
    "models": "models",
}
FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def parse_backend(text: str) -> dict[str, Any]:
    """`URL[,max_requests=N][,max_tokens=M][,api_key=K][,adaptive=1][,metrics_url=U][,engine_tenant=1]
    [,models=A|B]` → a backend table."""
    url, *options = (p.strip() for p in text.split(","))
    out: dict[str, Any] = {"url": url}
    for opt in options:
        name, sep, value = (x.strip() for x in opt.partition("="))
        if not sep or name not in BACKEND_OPTIONS:
            raise ValueError(
                f"bad --backend option {opt!r} in {text!r}: expected one of "
                f"{', '.join(k + '=...' for k in BACKEND_OPTIONS)}"
            )
        if name == "models":  # NOTE: `|` between ids: a comma separates the options
            out[name] = [m.strip() for m in value.split("|") if m.strip()]
            continue
        if name in ("api_key", "metrics_url"):
            out[name] = value
            continue
        if name in ("adaptive", "engine_tenant"):
            if value.lower() not in FLAGS:
                raise ValueError(f"bad --backend option {opt!r}: expected {name}=1 or {name}=0")
            out[name] = FLAGS[value.lower()]
            continue
        try:
            out[BACKEND_OPTIONS[name]] = int(value)
        except ValueError:
            raise ValueError(f"bad --backend option {opt!r}: {value!r} is not a whole number") from None
    return out


def parse_aliases(flags: list[str]) -> dict[str, str]:
    """`--alias ALIAS=MODEL` (repeated) as the `aliases` table."""
    pairs = [flag.partition("=") for flag in flags]
    if bad := [f for f, (_, sep, model) in zip(flags, pairs, strict=True) if not sep or not model]:
        raise ValueError(f"--alias {bad[0]!r}: expected ALIAS=MODEL")
    return {alias.strip(): model.strip() for alias, _, model in pairs}


def check_aliases(aliases: dict[str, str]) -> dict[str, str]:
    """ValueError for an empty id, or an alias that names another alias (one step: an alias names a model)."""
    for alias, model in aliases.items():
        if not alias.strip() or not model.strip():
            raise ValueError(f"aliases: a model id must not be empty ({alias!r} = {model!r})")
        if model in aliases:
            raise ValueError(f"aliases: {alias!r} names {model!r}, which is an alias itself")
    return aliases


def parse_fallbacks(flags: list[str]) -> dict[str, list[str]]:
    """`--fallback MODEL=OTHER[|OTHER]` (repeated) as the `fallbacks` table."""
    out: dict[str, list[str]] = {}
    for flag in flags:
        model, sep, others = flag.partition("=")
        if not sep or not others:
            raise ValueError(f"--fallback {flag!r}: expected MODEL=OTHER[|OTHER]")
        out[model.strip()] = [o.strip() for o in others.split("|")]
    return out


def check_unique(backends: list[BackendConfig]) -> None:
    """ValueError unless each backend has its own URL, credentials aside."""
    urls = [b.url for b in backends]
    if len(set(urls)) != len(urls):
        raise ValueError("backend URLs must be unique")
    if len({b.name for b in backends}) != len(urls):
        raise ValueError("backend URLs must differ in more than their credentials")


def check_fallbacks(fallbacks: dict[str, list[str]]) -> dict[str, list[str]]:
    """ValueError for an empty id or list, or a model that is its own fallback."""
    for model, others in fallbacks.items():
        if not model.strip() or not others or not all(o.strip() for o in others):
            raise ValueError(f"fallbacks: {model!r} needs a list of model ids, got {others!r}")
        if model in others:
            raise ValueError(f"fallbacks: {model!r} is among its own fallbacks")
    return fallbacks
