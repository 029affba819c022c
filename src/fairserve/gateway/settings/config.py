"""Gateway configuration: a TOML file and/or command-line flags, validated into one `GatewayConfig` (one error
line naming the key, see `api.config`). Tenants, keys and weights are `tenancy`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import PrivateAttr, ValidationInfo, field_validator, model_validator

from ...api.config import build_config as _build
from ...api.config import check_listen
from ...api.config import load_config as _load
from ...api.keys import key
from ...api.protocol import MAX_INT
from ...api.tokens import token_counter
from ...core import DEFAULT_TENANT, CostFunction, LinearCost, check_policy
from ...tenancy import ServerConfig, TenantConfig, check_tenants
from ...tenancy.config import SERVER_START as _SERVER_START
from ..admission.footprint import DEFAULT_MAX_TOKENS
from ..dispatch.placement import Placement, parse_placement
from . import backends as served
from .backends import BackendConfig, Price, parse_backend
from .replicas import check_sharing
from .urls import REDIS_URL, check_proxy, check_tls, checked_url

_JOINED = "the replicas' shared state is joined at start"


def _backends(flags: list[str]) -> list[dict[str, Any]]:
    return [parse_backend(b) for b in flags]


NO_KEY_DIGEST = "0" * 64  # the keyless tenant's "key": a SHA-256 no key has (its requests are told by no key)


class GatewayConfig(ServerConfig):
    _keyless: bool = PrivateAttr(default=False)
    listen: str = key(
        "127.0.0.1:8080", help="address to serve on", metavar="HOST:PORT", restart="the socket is bound at start"
    )
    backends: list[BackendConfig] = key(
        help="an OpenAI-compatible server",
        flag="--backend",
        metavar="URL[,max_requests=N][,max_tokens=M][,api_key=K][,adaptive=1][,metrics_url=U][,engine_tenant=1]"
        "[,models=A|B]",
        read=_backends,
        min_length=1,
        doc="`url` (with or without `/v1`), `max_inflight_requests` (32), `max_inflight_tokens` (prompt + max_tokens "
        "of the requests in flight; none), `api_key` (sent upstream), `adaptive` (false) and `metrics_url` "
        "(`URL/metrics`): see [Adaptive capacity](#adaptive-capacity); `engine_tenant` (false): add `vllm_xargs: "
        '{"fairserve_client": TENANT}` to the forwarded body, so a vLLM running fairserve\'s `VTCScheduler` counts '
        "the gateway's tenants ([vllm.md](vllm.md)); `models` (`[]`: those it lists at `/v1/models`): the model ids "
        "it serves, see [Several models](#several-models)",
    )
    policy: str = key(
        "vtc",
        help="the scheduling policy",
        metavar="P",
        restart="the counters are the policy's",
        doc="any `fairserve.core.make_policy` spec; `vtc-predict` = moving-average prediction",
    )
    prices: dict[str, Price] = key(
        default_factory=dict,
        help="by model id, a model's token costs; other models cost w_p, w_q",
        flag=False,
        doc='a model\'s token costs, `prices."llama-70b" = { w_p = 4, w_q = 8 }`; other models cost `w_p`, `w_q`',
    )
    aliases: dict[str, str] = key(
        default_factory=dict,
        help="a model id a client may name for another",
        flag="--alias",
        metavar="ALIAS=MODEL",
        read=served.parse_aliases,
        doc='model ids a client may name for another, `aliases = { "gpt-4o" = "llama-3-8b" }`: the request is '
        "served, routed, priced and logged as MODEL's (see [Several models](gateway.md#several-models))",
    )
    fallbacks: dict[str, list[str]] = key(
        default_factory=dict,
        help="models to serve a model's requests instead while its backends are all down",
        flag="--fallback",
        metavar="MODEL=OTHER[|OTHER]",
        read=served.parse_fallbacks,
        doc="models to serve a model's requests instead while every backend of its pool is down, in order, "
        '`fallbacks = { "llama-70b" = ["llama-8b"] }`: the first whose pool has a backend up serves it; queued '
        "ones move there when it goes down, or past `fallback_after_s` ([Several models](#several-models))",
    )
    fallback_after_s: float = key(
        0.0,
        help="a queued request of a model with fallbacks moves to the first with a backend up and a shorter queue "
        "once it has waited this long; 0: only when its pool is down",
        ge=0,
        le=3600,
        doc="a request queued this long for a model with `fallbacks` moves to the first of them with a backend up "
        "and fewer requests queued, once; 0: only when its pool is down. See [Several models](#several-models)",
    )
    scope: Literal["per_model", "global"] | None = key(
        None,
        help="the counters: per model pool, or one account per tenant over the fleet",
        restart="it decides the ledgers that hold the counters",
        shown="`per_model` (`global` with `state` or `snapshot`)",
        doc="the counters: per model pool, or one account per tenant over the fleet; see [Counter scope and "
        "prices](#counter-scope-and-prices)",
    )
    usage_log: str | None = key(
        None,
        help="one JSON line per request, appended to this file or written to stdout (-)",
        metavar="PATH|-",
        restart="it is opened at start",
        doc="one JSON line per request, appended to this file or written to stdout (`-`); see [Usage log](#usage-log)",
    )
    tokenize_concurrency: int = key(4, help="/tokenize and /detokenize requests in flight per tenant", ge=1, le=1024)
    queue_limit: int = key(256, help="queued requests per tenant", ge=1)
    queue_ttl_s: float = key(300.0, help="the longest a request may wait in the queue", gt=0)
    trusted_proxy: bool = key(False, help="honour X-Tenant-Id from a holder of a valid key")
    tokenizer: str = key(
        "",
        help='how prompts are counted: "estimate" (the default), "hf:PATH/tokenizer.json" or '
        '"tiktoken:ENCODING@PATH.tiktoken" (local files)',
        metavar="NAME",
        doc='`""`/`"estimate"`: `ceil(chars / 4)` (`fairserve/api/tokens.py`); `"hf:PATH/tokenizer.json"`: a local '
        "Hugging Face tokenizer, read with the `tokenizers` package (`pip install 'fairserve[tokenizers]'`); "
        '`"tiktoken:ENCODING@PATH"`: an OpenAI tiktoken encoding (`cl100k_base`, `o200k_base`, `p50k_base`, '
        "`r50k_base`) with its `.tiktoken` ranks file on local disk (`pip install 'fairserve[tiktoken]'`), or "
        '`"tiktoken:ENCODING"` if that file is already in tiktoken\'s cache (`$TIKTOKEN_CACHE_DIR`, else '
        "`$DATA_GYM_CACHE_DIR`, else `<tmp>/data-gym-cache`). Nothing is ever downloaded: a missing file stops the "
        "gateway at start with one error line",
    )
    default_max_tokens: int = key(
        DEFAULT_MAX_TOKENS,
        help="the output bound of a request that sets none, sent upstream as its max_tokens",
        ge=1,
        le=MAX_INT,
        doc="the output bound of a request that sets none: sent upstream as its `max_tokens` (`max_output_tokens` "
        "for `/v1/responses`), so the backend stops there; see [A request's footprint](#a-requests-footprint)",
    )
    models: list[str] = key(
        default_factory=list,
        help="model ids for /v1/models when no backend answers",
        flag="--model",
        metavar="NAME",
        read=list,
    )
    dispatch: str = key(
        "least_loaded",
        help="which of its pool's backends a request may go to: least_loaded (any: the least-loaded with room), "
        "shard:K (its tenant's hand of K backends: a flooding tenant fills at most K) or prefix[:DELTA] (the backend "
        "holding its prompt's prefix, waited for within DELTA of counter)",
        metavar="RULE",
        doc="which of its pool's backends a request may go to: `least_loaded` (any; the least-loaded with room takes "
        "it), `shard:K` (shuffle sharding: its tenant's deterministic hand of K, so a tenant that floods fills "
        "at most K backends) or `prefix[:DELTA]` (the backend its prompt's prefix was last sent to, waited for while "
        "those who overtake it are within DELTA of counter; without `state`); see [Dispatch](#dispatch)",
    )
    fail_fast_s: float = key(
        5.0,
        help="a request whose pool has had no backend up this long fails with 503 backend_unavailable, queued ones "
        "too, instead of waiting out queue_ttl_s; 0: they wait",
        ge=0,
        le=3600,
        doc="a request whose pool has had no backend up this long fails with 503 `backend_unavailable` (naming the "
        "backends and why they are down, with `Retry-After`), the queued ones together, instead of waiting out "
        "`queue_ttl_s`; 0: they wait. See [Health](#health)",
    )
    backend_cooldown_s: float = key(
        2.0, help="without active health checks: an unreachable backend is skipped this long", ge=0
    )
    health_path: str = key("/health", help="each backend's health check path", metavar="PATH")
    health_interval_s: float = key(
        5.0,
        help="seconds between health checks (0: none); a backend is down from a failed check or an unreachable "
        "request until a check passes",
        ge=0,
        le=3600,
    )
    connect_timeout_s: float = key(5.0, help="opening a connection to a backend", gt=0, le=3600)
    request_timeout_s: float = key(
        120.0,
        help="a backend's first byte: its status line, then the first piece of its body (all of a non-streamed answer)",
        gt=0,
    )
    chunk_timeout_s: float = key(30.0, help="between two pieces of a backend's answer", gt=0)
    metrics_interval_s: float = key(1.0, help="how often adaptive backends' /metrics are read", gt=0)
    access_log: bool = key(
        False,
        help="uvicorn's line per request in the log (the usage log, usage_log, is the record of requests; the line "
        "costs about 8% of the gateway's CPU per request)",
        restart=_SERVER_START,
    )
    state: str | None = key(
        None,
        help="share counters, backlog and backend capacity with the other replicas through Redis: "
        "redis://[:PASSWORD@]HOST:PORT/DB (rediss:// for TLS)",
        metavar="URL",
        restart=_JOINED,
        doc="share counters, backlog and backend capacity with the other replicas through Redis "
        "(`redis://[:PASSWORD@]HOST:PORT/DB`, `rediss://` for TLS); see [Running several "
        "replicas](#running-several-replicas)",
    )
    state_interval_s: float = key(
        0.02, help="how often charges are flushed to the shared state", restart=_JOINED, gt=0, le=1.0
    )
    state_ttl_s: float = key(
        3.0,
        help="a dead replica's leases and backlog expire after this (the same on every replica)",
        restart="every replica must use the same",
        gt=0,
        le=60.0,
    )
    snapshot: str | None = key(
        None,
        help="without state: counters, service and admin weights written to this file (at shutdown and every "
        "snapshot interval) and restored from it at start",
        metavar="FILE",
        restart="it is restored at start",
    )
    snapshot_interval_s: float = key(
        60.0,
        help="seconds between snapshots; 0: only at shutdown",
        restart="the snapshots are scheduled at start",
        ge=0,
        le=86400,
    )
    client_write_timeout_s: float = key(
        60.0, help="a stream whose client accepted nothing for this long is cut (nginx's send_timeout)", gt=0, le=3600
    )
    client_min_rate: int = key(
        1024,
        help="bytes/s: a stream whose client accepted less over a client write timeout during which data waited for "
        "it all along is cut; 0: no rate",
        metavar="BYTES",
        ge=0,
    )
    client_buffer_bytes: int = key(
        4 << 20,
        help="what one stream may hold read from its backend and not yet taken by its client (0: read the backend "
        "only as fast as the client takes it)",
        shown="4 MiB",
        ge=0,
        doc="what one stream may hold read from the backend and not yet taken by the client: the backend's slot frees "
        "when it has generated the answer, whatever the client's speed (see [Clients that do not "
        "read](#clients-that-do-not-read)); 0: read the backend only as fast as the client takes it",
    )
    client_buffer_total_bytes: int = key(
        256 << 20,
        help="what all streams together may hold read from their backends and not yet taken by their clients",
        shown="256 MiB",
        ge=0,
    )
    retry_after_max_s: float = key(30.0, help="the longest a backend's Retry-After keeps it skipped", ge=0, le=3600)
    metrics_window_s: float = key(
        900.0, help="a tenant's series stay in /metrics this long after its last request", ge=0
    )
    auth_failure_limit: int = key(
        20,
        help="after this many 401s within the window from one client address, or with one key from any address, a "
        "request from that address or with that key gets 429 until the window ends, unless its key is valid; 0: off",
        ge=0,
        doc="after this many 401s within `auth_failure_window_s` from one client address, or with one key from any "
        "address, a request from that address or with that key gets 429 until the window ends, unless its key is "
        "valid (a tenant's, the admin or the `/metrics` key: always served); 0: off; see "
        "[Internet-facing](#internet-facing)",
    )
    auth_failure_window_s: float = key(60.0, help="the window auth_failure_limit counts 401s in", gt=0, le=86400)
    forwarded_allow_ips: list[str] | None = key(
        None,
        help="the reverse proxies whose X-Forwarded-For gives the client's address: IP addresses and networks "
        "(10.0.0.0/8), or * (any)",
        metavar="IP,CIDR,...|*",
        restart=_SERVER_START,
        shown="uvicorn's: `$FORWARDED_ALLOW_IPS`, else `127.0.0.1` and `::1`",
        doc="the reverse proxies whose `X-Forwarded-For` gives the client's address (a list of IP addresses and "
        'networks such as `10.0.0.0/8`, or `"*"`: any); see [TLS](#tls). Not `trusted_proxy`, which is about '
        "`X-Tenant-Id`",
    )
    max_header_bytes: int = key(
        32 * 1024,
        help="a request line and its headers, together: beyond, 431 and the connection is closed",
        restart=_SERVER_START,
        ge=1024,
        le=1024 * 1024,
    )
    max_headers: int = key(100, help="header fields in a request: beyond, 431", restart=_SERVER_START, ge=8, le=10000)
    ssl_certfile: str | None = key(
        None,
        help="serve HTTPS (uvicorn's TLS) with this certificate chain (PEM)",
        metavar="FILE",
        restart=_SERVER_START,
    )
    ssl_keyfile: str | None = key(
        None,
        help="the certificate's private key (PEM), if not in the certificate file",
        metavar="FILE",
        restart=_SERVER_START,
    )

    _listen = field_validator("listen")(classmethod(lambda cls, v: check_listen(v)))

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        check_policy(v)  # raises ValueError naming the valid policies
        return v

    @field_validator("dispatch")
    @classmethod
    def _dispatch(cls, v: str) -> str:
        parse_placement(v)  # raises ValueError saying what is accepted
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

    @field_validator("aliases", "fallbacks")
    @classmethod
    def _models(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        return served.check_aliases(v) if info.field_name == "aliases" else served.check_fallbacks(v)

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
                check_proxy(entry)
        return v

    @field_validator("ssl_certfile", "ssl_keyfile", "snapshot", "usage_log")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or "\0" in v):
            raise ValueError(f"must be a file path, got {v!r}")
        return v

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        if not self.tenants:  # NOTE: keyless: every request is the one tenant's, no key asked (instance.py)
            self.tenants = [TenantConfig.model_validate({"name": DEFAULT_TENANT, "api_key_sha256": [NO_KEY_DIGEST]})]
            self._keyless = True
        check_tenants(self.tenants, self.admin_key, self.groups)
        served.check_unique(self.backends)
        if self.metrics_key is not None and (
            self.metrics_key == self.admin_key or self.metrics_key in self.key_owners()
        ):
            raise ValueError("metrics_key must differ from the admin key and every tenant's API key")
        check_sharing(self)
        check_tls(self.ssl_certfile, self.ssl_keyfile)
        return self

    @property
    def keyless(self) -> bool:
        """No tenants configured: every request is `DEFAULT_TENANT`'s, whatever key it has (or none)."""
        return self._keyless

    @property
    def counter_scope(self) -> str:
        if self.scope is not None:
            return self.scope
        return "global" if self.state is not None or self.snapshot is not None else "per_model"

    def placement(self) -> Placement:
        """`dispatch`, parsed."""
        return parse_placement(self.dispatch)

    def price_table(self) -> dict[str, CostFunction]:
        """By model id, its price (`prices."MODEL"`); other models cost the policy's w_p, w_q."""
        return {m: LinearCost(p.w_p, p.w_q) for m, p in self.prices.items()}

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"


def build_config(data: dict[str, Any]) -> GatewayConfig:
    """Validate a dict (parsed TOML, possibly with flag overrides). Raises ValueError with one line."""
    return _build(data, GatewayConfig)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """The file's keys, then `overrides` (e.g. from flags) on top; lists given as overrides replace the file's."""
    return _load(GatewayConfig, path, overrides)
