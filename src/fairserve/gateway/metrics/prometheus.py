"""The gateway's Prometheus exposition (text format 0.0.4), written directly rather than through prometheus_client's
registry: a scrape must stay cheap with thousands of tenants, and it runs on the event loop.

Per-tenant series follow `tenancy.TenantActivity`: only tenants with requests queued or running, or with a request in
the last `metrics_window_s`, appear; each one's lines are kept rendered and written again only when one of its values
changed, so a scrape costs O(active tenants) and mostly a join. There are no `_created` series. Labels come only
from configured tenants and backends. Per-tenant live values come from the ledger; backends' from the scheduler."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from prometheus_client.utils import floatToGoString

from ...core import Account, LedgerView, Listener, Request, TenantView
from ...core.account import parents
from ...tenancy import JAIN_HELP, METRICS_WINDOW_S, SPREAD_HELP, TENANT_FAMILIES, TenantActivity
from ..component import Part

if TYPE_CHECKING:
    from ...core import Ledger
    from ..dispatch.pools import Backend, Dispatch
    from ..settings.config import GatewayConfig
    from ..shared.state import SharedState


class Scheduler(Protocol):
    """What a scrape reads of the scheduler (gateway/admission/scheduler.py)."""

    ledger: Ledger
    backends: list[Backend]
    pools: Dispatch
    shared: SharedState | None

    def accounts(self) -> tuple[dict[str, Account], dict[str, Account], Callable[[Account], float]]:
        """(tenants, groups, counter_of), summed over the pools where each has a ledger."""
        ...


P = "fairserve_gateway_"
OUTCOMES = (
    "ok",
    "invalid",
    "client_timeout",
    "rejected",
    "queue_full",
    "insufficient_quota",
    "rate_limited",
    "timeout",
    "backend_unavailable",
    "client_disconnected",
    "client_stalled",
    "backend_error",
    "backend_rejected",
    "shutdown",
    "internal_error",
)
WAIT_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_LE = [f'le="{floatToGoString(b)}"' for b in (*WAIT_BUCKETS, float("inf"))]
# (family name, type, help, value): each group's series (a group above an active tenant has them)
GROUP_FAMILIES: tuple[tuple[str, str, str, Callable[[Account], float]], ...] = (
    ("group_service", "counter", "Service charged through the group (its subtree's)", lambda g: g.service),
    ("group_counter", "gauge", "The group's virtual counter among its siblings", lambda g: g.counter),
    ("group_queue_length", "gauge", "Requests queued in the group's subtree", lambda g: g.queued),
    ("group_inflight_requests", "gauge", "Requests of the group's subtree being served", lambda g: g.running),
    ("group_weight", "gauge", "Group weight among its siblings", lambda g: g.weight),
)
HELP = {
    "prompt_tokens": "Prompt tokens of settled requests (backend usage when reported, else the estimate)",
    "output_tokens": "Output tokens of settled requests",
    "requests": "Requests by how they ended",
    "queue_wait_seconds": "Time from arrival (or requeue) to dispatch",
}


def num(v: float) -> str:
    """A sample value as prometheus_client writes it (`1.0`, `+Inf`)."""
    return floatToGoString(v)


def label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _head(name: str, kind: str, text: str) -> str:
    return f"# HELP {name} {text}\n# TYPE {name} {kind}\n"


@dataclass(slots=True, eq=False)
class TenantStats:
    """What the gateway counts per tenant beyond the ledger: tokens and outcomes of ended requests, queue waits."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    waits: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))  # per bucket, not cumulative
    wait_sum: float = 0.0
    version: int = 0  # bumped on every change: the rendered lines below are current while `key` matches
    key: tuple[float, ...] = ()
    lines: list[str] = field(default_factory=list)  # one string per family (see GatewayMetrics.exposition)


@dataclass(slots=True, eq=False)
class LevelStats:
    """One priority level: requests queued at it now, and their queue waits."""

    queued: int = 0
    waits: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))
    wait_sum: float = 0.0


class LevelQueues(Listener):
    """Each ledger's listener (core/listener.py) for the requests queued per priority level: the queue gauge follows
    the ledger's own queue (arrivals, requeues, admissions, cancellations), never a count kept beside it."""

    def __init__(self, level: Callable[[int], LevelStats]) -> None:
        self.level = level

    def queued(self, req: Request) -> None:
        self.level(req.priority or 0).queued += 1

    def left(self, req: Request) -> None:
        self.level(req.priority or 0).queued -= 1


class GatewayMetrics(Part):
    def __init__(self, window_s: float = METRICS_WINDOW_S) -> None:
        self.activity = TenantActivity(window_s)
        self.tenants: dict[str, TenantStats] = {}
        self.levels: dict[int, LevelStats] = {}  # by priority level, as requests reach them
        self.queues = LevelQueues(self._level)  # listens to every ledger of the scheduler
        self.scheduler: Scheduler | None = None
        self._active: list[str] | None = None  # the tenants of the last scrape, and their part of it
        self._tenant_part = b""
        heads = [
            _head(P + name + ("_total" if kind == "counter" else ""), kind, text)
            for _, name, kind, text in TENANT_FAMILIES
        ]
        for family, text in HELP.items():
            kind = "histogram" if family == "queue_wait_seconds" else "counter"
            heads.append(_head(P + family + ("_total" if kind == "counter" else ""), kind, text))
        self._heads = heads  # one per family, in the order of `TenantStats.lines`

    @property
    def active_tenants(self) -> list[str]:
        """The tenants the last scrape wrote series for."""
        return self._active or []

    def bind(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def check(self, old: GatewayConfig, new: GatewayConfig) -> None:
        """Any window applies live."""

    def configure(self, cfg: GatewayConfig) -> None:
        """A tenant's series stay `metrics_window_s` after its last request, from the next scrape on."""
        self.activity.window_s = cfg.metrics_window_s

    def _stats(self, tenant: str) -> TenantStats:
        s = self.tenants.get(tenant)
        if s is None:
            s = self.tenants[tenant] = TenantStats()
        s.version += 1
        return s

    # ---- what happened (the scheduler and the proxy call these) ----------------------------------------------------
    def arrived(self, tenant: str) -> None:
        self.activity.saw(tenant)

    def refused(self, tenant: str, outcome: str) -> None:
        """A request that never entered the ledger (invalid, client_timeout, queue_full, rejected)."""
        self.activity.saw(tenant)
        s = self._stats(tenant)
        s.outcomes[outcome] = s.outcomes.get(outcome, 0) + 1

    def waited(self, tenant: str, seconds: float, level: int = 0) -> None:
        s = self._stats(tenant)
        bucket = bisect.bisect_left(WAIT_BUCKETS, seconds)
        s.waits[bucket] += 1
        s.wait_sum += seconds
        lv = self._level(level)
        lv.waits[bucket] += 1
        lv.wait_sum += seconds

    def _level(self, level: int) -> LevelStats:
        lv = self.levels.get(level)
        if lv is None:
            lv = self.levels[level] = LevelStats()
        return lv

    def ended(self, tenant: str, outcome: str, prompt_tokens: int, output_tokens: int) -> None:
        self.activity.saw(tenant)
        s = self._stats(tenant)
        s.outcomes[outcome] = s.outcomes.get(outcome, 0) + 1
        s.prompt_tokens += prompt_tokens
        s.output_tokens += output_tokens

    def outcome_count(self, tenant: str, outcome: str) -> int:
        s = self.tenants.get(tenant)
        return s.outcomes.get(outcome, 0) if s is not None else 0

    # ---- the exposition ---------------------------------------------------------------------------------------------
    def exposition(self) -> bytes:
        sched = self.scheduler
        assert sched is not None, "bind() first"
        ledger = sched.ledger
        accounts, groups, counter_of = sched.accounts()  # NOTE: summed over the pools where each has a ledger
        active = self.activity.active(lambda t: (a := accounts.get(t)) is not None and bool(a.queued or a.running))
        rows: list[TenantStats] = []
        backlogged = {}
        changed = active != self._active
        for tenant in active:
            acct = accounts.get(tenant)
            if acct is None:
                continue
            s = self.tenants.get(tenant) or self._stats(tenant)
            counter = counter_of(acct)
            key = (s.version, acct.service, counter, acct.queued, acct.running, acct.weight)
            if s.key != key:
                view = TenantView(tenant, acct.weight, counter, acct.service, acct.queued, acct.running)
                s.key, s.lines, changed = key, self._render(tenant, view, s), True
                if acct.queued:
                    backlogged[tenant] = view
            elif acct.queued:
                backlogged[tenant] = TenantView(tenant, acct.weight, counter, acct.service, acct.queued, acct.running)
            rows.append(s)
        if changed:  # NOTE: else the tenants' part of the last scrape is still exact
            self._active = active
            body = []
            for k, head in enumerate(self._heads):
                body.append(head)
                body += [s.lines[k] for s in rows if s.lines[k]]
            self._tenant_part = "".join(body).encode()
        partial = LedgerView(ledger.policy.name, backlogged)  # NOTE: the backlogged tenants: the same numbers
        rest = (
            _head(P + "backlogged_counter_spread", "gauge", SPREAD_HELP)
            + f"{P}backlogged_counter_spread {num(partial.counter_spread)}\n"
            + _head(P + "jain_index", "gauge", JAIN_HELP)
            + f"{P}jain_index {num(partial.jain)}\n"
            + self._groups(groups, active)
            + self._levels()
            + self._backends(sched)
        )
        return self._tenant_part + rest.encode()

    @staticmethod
    def _render(tenant: str, view: TenantView, s: TenantStats) -> list[str]:
        """The tenant's lines, one string per family (TENANT_FAMILIES, then HELP's order)."""
        # NOTE: labels in name order, as prometheus_client writes them; tenant names need no escaping ([A-Za-z0-9_.@-])
        t = f'tenant="{tenant}"'
        lines = []
        for field_, name, kind, _ in TENANT_FAMILIES:
            full = P + name + ("_total" if kind == "counter" else "")
            lines.append(f"{full}{{{t}}} {num(getattr(view, field_))}\n")
        lines.append(f"{P}prompt_tokens_total{{{t}}} {num(s.prompt_tokens)}\n")
        lines.append(f"{P}output_tokens_total{{{t}}} {num(s.output_tokens)}\n")
        # NOTE: only the outcomes that happened: 12 zero series per tenant would be most of the scrape
        lines.append(
            "".join(f'{P}requests_total{{outcome="{o}",{t}}} {num(n)}\n' for o, n in sorted(s.outcomes.items()) if n)
        )
        total, hist = 0, []
        for le, n in zip(_LE, s.waits, strict=True):
            total += n
            hist.append(f"{P}queue_wait_seconds_bucket{{{le},{t}}} {num(total)}\n")
        hist.append(f"{P}queue_wait_seconds_sum{{{t}}} {num(s.wait_sum)}\n")
        hist.append(f"{P}queue_wait_seconds_count{{{t}}} {num(total)}\n")
        lines.append("".join(hist))
        return lines

    @staticmethod
    def _groups(groups: dict[str, Account], active: list[str]) -> str:
        """Each group above an active tenant: GROUP_FAMILIES, 5 series (none without groups)."""
        if not groups:
            return ""
        seen: dict[str, Account] = {}
        for tenant in active:
            for path in parents(tenant):
                if path not in seen and (g := groups.get(path)) is not None:
                    seen[path] = g
        out = []
        for name, kind, text, value in GROUP_FAMILIES:
            full = P + name + ("_total" if kind == "counter" else "")
            out.append(_head(full, kind, text))
            out += [f'{full}{{group="{label(path)}"}} {num(value(g))}\n' for path, g in seen.items()]
        return "".join(out)

    def _levels(self) -> str:
        """Per priority level: the queue length and the queue wait histogram."""
        levels = sorted(self.levels.items())
        out = [_head(P + "priority_queue_length", "gauge", "Requests queued at this priority level")]
        out += [f'{P}priority_queue_length{{priority="{lv}"}} {num(s.queued)}\n' for lv, s in levels]
        full = P + "priority_queue_wait_seconds"
        out.append(_head(full, "histogram", "Time from arrival (or requeue) to dispatch, by priority level"))
        for lv, s in levels:
            total = 0
            for le, n in zip(_LE, s.waits, strict=True):
                total += n
                out.append(f'{full}_bucket{{{le},priority="{lv}"}} {num(total)}\n')
            out.append(f'{full}_sum{{priority="{lv}"}} {num(s.wait_sum)}\n')
            out.append(f'{full}_count{{priority="{lv}"}} {num(total)}\n')
        return "".join(out)

    @staticmethod
    def _backends(s: Scheduler) -> str:
        """Each backend's in-flight requests and tokens, health and limit, read at scrape time."""
        families = (
            ("backend_inflight_requests", "Requests in flight", lambda b: b.requests),
            ("backend_inflight_tokens", "Prompt + max_tokens of requests in flight", lambda b: b.tokens),
            (
                "backend_healthy",
                "1 if the backend is up (its last health check or request reached it)",
                lambda b: 1 if b.healthy else 0,
            ),
            (
                "backend_limit_requests",
                "In-flight request limit now (adaptive backends: from the backend's /metrics; else "
                "max_inflight_requests)",
                lambda b: b.limit,
            ),
        )
        out = []
        for name, text, value in families:
            out.append(_head(P + name, "gauge", text))
            # NOTE: the URL without credentials: /metrics may be readable by anyone
            out += [f'{P}{name}{{backend="{label(b.name)}"}} {num(value(b))}\n' for b in s.backends]
        # NOTE: a pool is the backends serving a model, labelled by the models they all serve; by label, so two pools
        # that serve the same models are one series (each backend's requests counted once in it: pools of one label may
        # share backends, e.g. a merged pool's and its leftover's after a reload, gateway/dispatch/fleet.py)
        queued: dict[str, int] = {}
        members: dict[str, set[Backend]] = {}
        for pool in s.pools.pools.values():
            name = label(pool.name)
            queued[name] = queued.get(name, 0) + pool.queued
            members.setdefault(name, set()).update(pool.backends)
        pools = {name: (n, sum(b.requests for b in members[name])) for name, n in queued.items()}
        for i, (name, text) in enumerate(
            (
                ("pool_queue_length", "Requests waiting for a pool's backends (the backends serving a model)"),
                ("pool_inflight_requests", "Requests in flight on a pool's backends"),
            )
        ):
            out.append(_head(P + name, "gauge", text))
            out += [f'{P}{name}{{pool="{pool}"}} {num(row[i])}\n' for pool, row in pools.items()]
        if s.shared is not None:
            out.append(
                _head(
                    P + "shared_state_up",
                    "gauge",
                    "1 if the last sync with the shared state (Redis) succeeded; 0: serving from local state",
                )
            )
            out.append(f"{P}shared_state_up {num(1 if s.shared.up else 0)}\n")
        return "".join(out)
