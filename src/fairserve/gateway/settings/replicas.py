"""What a gateway configuration may combine with shared state (`state`, replicas on one Redis) and with a snapshot:
the checks `GatewayConfig` runs when it is built, kept apart from its keys."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ...core import check_policy, policy_names
from ..dispatch.placement import Placement


class Sharing(Protocol):
    """What of a `GatewayConfig` the checks read (a protocol: config.py imports this module)."""

    # NOTE: read-only properties, so that the config's own (narrower) field types fit
    @property
    def state(self) -> str | None: ...
    @property
    def snapshot(self) -> str | None: ...
    @property
    def policy(self) -> str: ...
    @property
    def scope(self) -> str | None: ...
    @property
    def backends(self) -> Sequence[Any]: ...

    def placement(self) -> Placement: ...


def check_sharing(cfg: Sharing) -> None:
    """ValueError (one line) for what shared state or a snapshot cannot be combined with."""
    if cfg.state is not None and cfg.placement().prefix_delta is not None:
        raise ValueError(
            "dispatch: prefix works on one gateway (each replica would keep its own record of "
            "where prefixes went); with state use least_loaded or shard:K"
        )
    if cfg.state is not None:
        entry, _ = check_policy(cfg.policy)
        if not entry.capabilities.shares_counters:
            sharing = ", ".join(n for n in policy_names() if check_policy(n)[0].capabilities.shares_counters)
            raise ValueError(
                f"state: shared state needs a policy that shares its counters ({sharing}), not {cfg.policy!r}"
            )
        if cfg.snapshot is not None:
            raise ValueError("snapshot: the shared state (state) keeps the counters already; give one or the other")
        if any(b.adaptive for b in cfg.backends):
            raise ValueError(
                "state: adaptive backends cannot be combined with shared state (leases use max_inflight_requests)"
            )
    if cfg.scope == "per_model" and (cfg.state is not None or cfg.snapshot is not None):
        key = "state" if cfg.state is not None else "snapshot"
        raise ValueError(
            f'scope: "per_model" cannot be combined with {key} (it keeps one account per tenant): '
            'use scope = "global", or one gateway (group) per model'
        )
