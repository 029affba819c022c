"""`fairserve top`: the dashboard in a terminal. Polls `GET /admin/dashboard` of a gateway or `fairserve serve` and
shows per-tenant service rates, counters, queues and in-flight requests, and the tenant tree with each node's share
when groups are configured, refreshed in place (`--once`: one snapshot, printed)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

import httpx

from .argtypes import positive

if TYPE_CHECKING:
    from rich.console import Group

PATH = "/admin/dashboard"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "top",
        help="per-tenant rates, counters and queues of a gateway or serve, live in the terminal",
        description="Show what a fairserve gateway or `fairserve serve` gives each tenant: service rate, virtual "
        "counter, queue, in-flight requests, weights, Jain's index and (gateway) backends, refreshed in "
        "place. Reads the admin API, so it needs the admin key.",
    )
    p.add_argument("--target", required=True, metavar="URL", help="the server, e.g. http://127.0.0.1:8080")
    p.add_argument("--admin-key", required=True, metavar="KEY", help="the server's admin key")
    p.add_argument(
        "--interval",
        type=positive(float, "a number"),
        default=1.0,
        metavar="S",
        help="seconds between refreshes (default: %(default)g)",
    )
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    return p


def base_url(target: str) -> str:
    base = target.strip().rstrip("/")
    if not base.startswith(("http://", "https://")) or not base.split("//", 1)[1]:
        raise ValueError(f"bad --target {target!r}: expected an http(s) URL such as http://127.0.0.1:8080")
    return base.removesuffix("/v1")


def fetch(client: httpx.Client, base: str, admin_key: str) -> dict[str, Any]:
    """The dashboard's JSON; ValueError with one line for anything else."""
    try:
        r = client.get(base + PATH, headers={"Authorization": f"Bearer {admin_key}"})
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach {base}: {e}") from None
    if r.status_code in (401, 403):
        raise ValueError(f"{base} refused the admin key: {_message(r)}")
    if r.status_code == 404:
        raise ValueError(f"{base} has no {PATH}: is it a fairserve gateway, or `fairserve serve` with a policy?")
    if r.status_code != 200:
        raise ValueError(f"{base}{PATH} answered HTTP {r.status_code}: {_message(r)}")
    try:
        return r.json()
    except ValueError:
        raise ValueError(f"{base}{PATH} did not answer JSON") from None


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:200] or "(empty body)"


def _num(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def render(data: dict[str, Any], target: str) -> Group:
    """Tenants, fairness and (gateway) backends, as rich renderables."""
    from rich.console import Group  # NOTE: imported here: every `fairserve` command builds this parser
    from rich.table import Table
    from rich.text import Text

    has_rates = bool(data["history"]["t"])
    tenants = Table(title=f"{target}  policy {data['policy']}", title_justify="left", expand=False)
    for name, justify in [
        ("tenant", "left"),
        ("weight", "right"),
        ("service/s", "right"),
        ("service", "right"),
        ("counter", "right"),
        ("queued", "right"),
        ("in flight", "right"),
    ]:
        tenants.add_column(name, justify=justify)  # type: ignore[arg-type]
    for t in data["tenants"]:
        tenants.add_row(
            t["name"],
            f"{t['weight']:g}",
            _num(t["rate"]) if has_rates else "–",
            _num(t["service"], 0),
            _num(t["counter"]),
            str(t["queue_length"]),
            str(t["in_flight"]),
        )
    backlogged = data["backlogged"]
    fair = (
        f"Jain's index {data['jain']:.3f}   counter spread {data['counter_spread']:,.1f}   "
        f"backlogged: {', '.join(backlogged)}"
        if len(backlogged) >= 2
        else f"backlogged: {', '.join(backlogged) or 'none'} (Jain's index and spread need two)"
    )
    history = data["history"]
    # NOTE: after an idle gap the rates are over the gap, not the usual window
    span = history.get("rate_span_s") or history["window_s"]
    parts: list[Any] = [tenants, Text(fair), Text(f"service/s over the last {span:g} s", style="dim")]
    if data.get("tree"):
        parts.append(_tree(data["tree"], has_rates))
    if data.get("backends") is not None:
        backends = Table(title="backends", title_justify="left")
        for name in ("backend", "health", "in flight / limit", "tokens in flight"):
            backends.add_column(name, justify="left" if name in ("backend", "health") else "right")
        for b in data["backends"]:
            backends.add_row(
                b["url"],
                "healthy" if b["healthy"] else "unreachable",
                f"{b['in_flight_requests']} / {b['limit_requests']}",
                str(b["in_flight_tokens"]),
            )
        parts.append(backends)
    return Group(*parts)


def _tree(top: list[dict[str, Any]], has_rates: bool) -> Any:
    """The tenant tree: one row per node, indented under its group, with its share of its siblings."""
    from rich.table import Table

    table = Table(title="tenant tree (share: of its siblings' service rate)", title_justify="left")
    for name in ("node", "weight", "priority", "share", "service/s", "counter", "queued", "in flight"):
        table.add_column(name, justify="left" if name == "node" else "right")

    def walk(nodes: list[dict[str, Any]], depth: int) -> None:
        for n in nodes:
            table.add_row(
                "  " * depth + n["name"] + ("/" if n["kind"] == "group" else ""),
                f"{n['weight']:g}",
                str(n["priority"]),
                f"{100 * n['share']:.1f}%",
                _num(n["rate"]) if has_rates else "–",
                _num(n["counter"]),
                str(n["queue_length"]),
                str(n["in_flight"]),
            )
            walk(n["children"], depth + 1)

    walk(top, 0)
    return table


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    base = base_url(args.target)
    console = Console()
    with httpx.Client(timeout=10.0) as client:
        data = fetch(client, base, args.admin_key)
        if args.once:
            if not data["history"]["t"]:  # the server had no history yet: a second look gives the rates
                time.sleep(args.interval)
                data = fetch(client, base, args.admin_key)
            console.print(render(data, base))
            return 0
        try:
            with Live(render(data, base), console=console, auto_refresh=False, screen=False) as live:
                while True:
                    time.sleep(args.interval)
                    live.update(render(fetch(client, base, args.admin_key), base), refresh=True)
        except KeyboardInterrupt:
            return 0
