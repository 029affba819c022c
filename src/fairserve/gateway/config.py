"""Gateway configuration: a TOML file and/or command-line flags, validated into one `GatewayConfig` (one error
line naming the key, see `api.config`). Tenants, keys and weights are `tenancy`'s."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, Field, field_validator, model_validator

from ..api.config import Strict, check_listen
from ..api.config import build_config as _build
from ..api.config import load_config as _load
from ..api.protocol import MAX_INT
from ..api.tokens import token_counter
from ..core import check_policy, policy_names
from ..tenancy import MAX_COST, GroupConfig, TenantConfig, TenantsMixin, check_tenants
from .footprint import DEFAULT_MAX_TOKENS

# NOTE: query parameters that carry a secret (the Redis client takes `?password=`): their values are never shown
_SECRET_PARAM = re.compile(r"(?i)([?&;](?:password|passwd|pass|pwd|secret|token|api_key|apikey|key|auth)=)[^&;#\s]*")


def redact(url: str) -> str:
    """`url` as it may be shown, logged or used as a label: any `user:password@` replaced by `***@`, the value of a
    query parameter that may hold a secret (`?password=...`) by `***`. A malformed URL (`redis:/:pw@host`) is masked
    from its scheme to its last `@`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if "@" in parts.netloc:
        url = urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
    elif "@" in url:  # NOTE: not a URL urlsplit understands: whatever precedes an @ may be a credential
        head, _, tail = url.rpartition("@")
        scheme, sep, _ = head.partition(":")
        url = (scheme + sep if sep and scheme.isalnum() else "") + "***@" + tail
    return _SECRET_PARAM.sub(r"\1***", url)


_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*:(?://)?)[^\s@'\"]*@")


def redact_text(text: str) -> str:
    """`text` (an error message, a log line) with the credentials of every URL in it replaced by `***`, malformed
    URLs and secret query parameters included."""
    return _SECRET_PARAM.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


HTTP_URL = re.compile(r"^https?://[^/\s]+")
REDIS_URL = re.compile(r"^(redis|rediss|unix)://\S+$")


def checked_url(v: str, pattern: re.Pattern[str], what: str) -> str:
    """`v` stripped, if it matches `pattern`; else ValueError naming `what` was expected (credentials hidden)."""
    v = v.strip()
    if not pattern.match(v):
        raise ValueError(f"must be {what}, got {redact(v)!r}")
    return v


def has_credentials(url: str) -> bool:
    return "@" in urlsplit(url).netloc


class BackendConfig(Strict):
    url: str
    # NOTE: `max_requests` / `max_tokens`, the flag's names (`--backend URL,max_requests=N`), work in TOML too
    max_inflight_requests: int = Field(32, ge=1, validation_alias=AliasChoices("max_inflight_requests", "max_requests"))
    max_inflight_tokens: int | None = Field(
        None, ge=1, validation_alias=AliasChoices("max_inflight_tokens", "max_tokens")
    )  # prompt + max_tokens of the requests in flight
    api_key: str | None = None  # sent upstream as `Authorization: Bearer`
    adaptive: bool = False  # limit in-flight requests from the backend's /metrics
    metrics_url: str | None = None  # default: URL/metrics (gateway/capacity.py)
    engine_tenant: bool = False  # name the tenant to the engine (vLLM with VTCScheduler)
    # the model ids it serves; empty: those it lists at /v1/models (gateway/dispatch.py)
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


def _check_proxy(entry: str) -> None:
    """ValueError unless `entry` is an IP address or a network (CIDR, host bits zero) as uvicorn reads them: it takes
    anything else for a name that never matches."""
    try:
        ipaddress.ip_network(entry) if "/" in entry else ipaddress.ip_address(entry)
    except ValueError:
        raise ValueError(
            f'each entry must be an IP address or a network like 10.0.0.0/8 (or the list be ["*"]), got {entry!r}'
        ) from None


_SERVER = "the HTTP server's, set when it starts"


def restart_only(why: str, default: Any = ..., **kw: Any) -> Any:
    """A config key that only a restart applies, and why (a live reload that changes it is refused naming both);
    every other key is applied by a live reload (gateway/reload.py)."""
    return Field(default, json_schema_extra={"restart": why}, **kw)


class Price(Strict):
    """A model's cost of a prompt and an output token (`prices."llama-70b" = { w_p = 4, w_q = 8 }`)."""

    w_p: float = Field(1.0, ge=0, le=MAX_COST, allow_inf_nan=False)
    w_q: float = Field(2.0, ge=0, le=MAX_COST, allow_inf_nan=False)


class GatewayConfig(TenantsMixin, Strict):
    listen: str = restart_only("the socket is bound at start", "127.0.0.1:8080")
    backends: list[BackendConfig] = Field(min_length=1)
    tenants: list[TenantConfig] = Field(min_length=1)
    groups: list[GroupConfig] = Field(default_factory=list)  # weights and priorities of the tenant tree's groups
    policy: str = restart_only("the counters are the policy's", "vtc")
    w_p: float = Field(1.0, ge=0, le=MAX_COST, allow_inf_nan=False)
    w_q: float = Field(2.0, ge=0, le=MAX_COST, allow_inf_nan=False)
    prices: dict[str, Price] = Field(default_factory=dict)  # by model id; others cost w_p, w_q
    # counters per model pool (each pool its own resource) or one account per tenant over the fleet; None:
    # per_model, except with `state` or `snapshot` (which keep one account per tenant): global
    scope: Literal["per_model", "global"] | None = restart_only("it decides the ledgers that hold the counters", None)
    # one JSON line per request: a file (appended to) or "-" (stdout)
    usage_log: str | None = restart_only("it is opened at start", None)
    tokenize_concurrency: int = Field(4, ge=1, le=1024)  # /tokenize and /detokenize in flight per tenant
    queue_limit: int = Field(256, ge=1)  # queued requests per tenant
    queue_ttl_s: float = Field(300.0, gt=0)  # the longest a request may wait in the queue
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1)
    admin_key: str | None = restart_only("the admin API takes it at start", None)
    trusted_proxy: bool = False  # honour `X-Tenant-Id` from a holder of a valid key
    tokenizer: str = ""  # "estimate", "hf:PATH", "tiktoken:ENCODING[@PATH]" (api.tokens)
    default_max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1, le=MAX_INT)  # sent when a request sets no max_tokens
    models: list[str] = Field(default_factory=list)  # /v1/models when no backend answers
    backend_cooldown_s: float = Field(2.0, ge=0)  # without health checks: an unreachable backend is skipped this long
    # health: each backend's `health_path` is read every `health_interval_s` (0: no active checks); a backend is
    # down from a failed check or an unreachable request until a check passes
    health_path: str = "/health"
    health_interval_s: float = Field(5.0, ge=0, le=3600)
    # timeouts (see docs/gateway.md, "Timeouts")
    client_timeout_s: float = restart_only(_SERVER, 30.0, gt=0, le=3600)  # a client's request headers and body, each
    connect_timeout_s: float = Field(5.0, gt=0, le=3600)  # opening a connection to a backend
    request_timeout_s: float = Field(120.0, gt=0)  # a backend's first byte (a whole non-streamed answer)
    chunk_timeout_s: float = Field(30.0, gt=0)  # between two pieces of a backend's answer
    # SIGTERM: in-flight requests get this long to finish
    drain_timeout_s: float = restart_only(_SERVER, 30.0, ge=0, le=3600)
    metrics_key: str | None = None  # Bearer key required by /metrics (default: open)
    access_log: bool = restart_only(_SERVER, True)  # uvicorn's line per request (`--no-access-log`)
    metrics_interval_s: float = Field(1.0, gt=0)  # how often adaptive backends' /metrics are read
    # redis://[:PASSWORD@]HOST:PORT/DB (rediss:// TLS): shared by replicas
    state: str | None = restart_only("the replicas' shared state is joined at start", None)
    # how often charges are flushed to the shared state
    state_interval_s: float = restart_only("the replicas' shared state is joined at start", 0.02, gt=0, le=1.0)
    # a dead replica's leases and backlog expire after this
    state_ttl_s: float = restart_only("every replica must use the same", 3.0, gt=0, le=60.0)
    # without `state`: counters, service and weights written to this file (at shutdown and every
    # `snapshot_interval_s`) and restored from it at start (gateway/snapshot.py)
    snapshot: str | None = restart_only("it is restored at start", None)
    # 0: only at shutdown
    snapshot_interval_s: float = restart_only("the snapshots are scheduled at start", 60.0, ge=0, le=86400)
    # clients that do not read (gateway/stalls.py): a stream is cut when its client accepted nothing for
    # `client_write_timeout_s` (nginx's send_timeout), or less than `client_min_rate` bytes/s over that long while
    # data waited for it (0: no rate)
    client_write_timeout_s: float = Field(60.0, gt=0, le=3600)
    client_min_rate: int = Field(1024, ge=0)
    # what a stream may hold read from its backend and not yet taken by its client (gateway/pipe.py): the backend's
    # slot frees at generation speed, whatever the client's; per stream, and over every stream
    client_buffer_bytes: int = Field(4 << 20, ge=0)
    client_buffer_total_bytes: int = Field(256 << 20, ge=0)
    retry_after_max_s: float = Field(30.0, ge=0, le=3600)  # the longest a backend's Retry-After is honoured
    metrics_window_s: float = Field(900.0, ge=0)  # a tenant's series stay in /metrics this long after its last request
    # repeated 401s: after `auth_failure_limit` within `auth_failure_window_s` from one client address, or with one
    # key from any, 429 for a request from it or with it until the window ends, unless its key is valid (0: no limit)
    auth_failure_limit: int = Field(20, ge=0)
    auth_failure_window_s: float = Field(60.0, gt=0, le=86400)
    # the proxies whose X-Forwarded-For uvicorn takes the client's address from: IPs, CIDRs, or ["*"] (any); None:
    # uvicorn's default ($FORWARDED_ALLOW_IPS, else 127.0.0.1 and ::1)
    forwarded_allow_ips: list[str] | None = restart_only(_SERVER, None)
    # a request line and headers, together (431)
    max_header_bytes: int = restart_only(_SERVER, 32 * 1024, ge=1024, le=1024 * 1024)
    max_headers: int = restart_only(_SERVER, 100, ge=8, le=10000)  # header fields in a request (431)
    ssl_certfile: str | None = restart_only(_SERVER, None)  # serve HTTPS (uvicorn's TLS): the certificate chain, PEM
    ssl_keyfile: str | None = restart_only(_SERVER, None)  # its private key, PEM (if not in the certificate file)

    _listen = field_validator("listen")(classmethod(lambda cls, v: check_listen(v)))

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        check_policy(v)  # raises ValueError naming the valid policies
        return v

    @field_validator("health_path")
    @classmethod
    def _health_path(cls, v: str) -> str:
        if not v.startswith("/") or any(c.isspace() for c in v):
            raise ValueError(f"must be a path starting with '/', e.g. /health, got {v!r}")
        return v

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, v: str) -> str:
        token_counter(v)  # loads it now, so a bad name or file stops the gateway at start
        return v

    @field_validator("state")
    @classmethod
    def _state(cls, v: str | None) -> str | None:
        return checked_url(v, REDIS_URL, "a Redis URL like redis://127.0.0.1:6379/0") if v is not None else None

    @field_validator("forwarded_allow_ips", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return [part.strip() for part in v.split(",")] if isinstance(v, str) else v  # NOTE: uvicorn's "A,B" form

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxies(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and v != ["*"]:
            for entry in v:
                _check_proxy(entry)
        return v

    @field_validator("ssl_certfile", "ssl_keyfile", "snapshot", "usage_log")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or "\0" in v):
            raise ValueError(f"must be a file path, got {v!r}")
        return v

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        check_tenants(self.tenants, self.admin_key, self.groups)
        urls = [b.url for b in self.backends]
        if len(set(urls)) != len(urls):
            raise ValueError("backend URLs must be unique")
        if len({b.name for b in self.backends}) != len(urls):
            raise ValueError("backend URLs must differ in more than their credentials")
        if self.metrics_key is not None and (
            self.metrics_key == self.admin_key or self.metrics_key in self.key_owners()
        ):
            raise ValueError("metrics_key must differ from the admin key and every tenant's API key")
        if self.state is not None:
            entry, _ = check_policy(self.policy)
            if not entry.capabilities.shares_counters:
                sharing = ", ".join(n for n in policy_names() if check_policy(n)[0].capabilities.shares_counters)
                raise ValueError(
                    f"state: shared state needs a policy that shares its counters ({sharing}), not {self.policy!r}"
                )
            if self.snapshot is not None:
                raise ValueError("snapshot: the shared state (state) keeps the counters already; give one or the other")
            if any(b.adaptive for b in self.backends):
                raise ValueError(
                    "state: adaptive backends cannot be combined with shared state (leases use max_inflight_requests)"
                )
        if self.scope == "per_model" and (self.state is not None or self.snapshot is not None):
            key = "state" if self.state is not None else "snapshot"
            raise ValueError(
                f'scope: "per_model" cannot be combined with {key} (it keeps one account per tenant): '
                'use scope = "global", or one gateway (group) per model'
            )
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile: needs ssl_certfile (the certificate) too")
        for key in ("ssl_certfile", "ssl_keyfile"):
            path = getattr(self, key)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{key}: no such file: {path}")
        return self

    @property
    def counter_scope(self) -> str:
        if self.scope is not None:
            return self.scope
        return "global" if self.state is not None or self.snapshot is not None else "per_model"

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"


def build_config(data: dict[str, Any]) -> GatewayConfig:
    """Validate a dict (parsed TOML, possibly with flag overrides). Raises ValueError with one line."""
    return _build(data, GatewayConfig)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """The file's keys, then `overrides` (e.g. from flags) on top; lists given as overrides replace the file's."""
    return _load(GatewayConfig, path, overrides)


def reload_keys(model: type[Strict]) -> tuple[frozenset[str], dict[str, str]]:
    """(the keys a live reload applies, the keys only a restart applies and why), from the fields' declarations
    (`restart_only`): the one place a key says it."""
    restart = {
        k: str(f.json_schema_extra["restart"])
        for k, f in model.model_fields.items()
        if isinstance(f.json_schema_extra, dict) and "restart" in f.json_schema_extra
    }
    return frozenset(model.model_fields) - set(restart), restart


LIVE, RESTART = reload_keys(GatewayConfig)
