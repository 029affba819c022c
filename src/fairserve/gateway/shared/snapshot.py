"""Keeping the accounts across a restart without shared state (`snapshot = FILE`, `--snapshot FILE`).

Without `state` or `snapshot`, a restart starts every tenant's counter and service from 0 and forgets the weights
set through the admin API. With `snapshot`, each tenant's counter, service and weight (and each group's weight) are
written to FILE (JSON,
replaced atomically: a crash leaves the previous snapshot whole) at shutdown, after the drain, and every
`snapshot_interval_s`; at start they are read back:

- weights set through the admin API (a tenant's or a group's) come back, unless the config's weight for that node
  changed since (then the config wins);
- counters and service come back under the same policy, where it can take counters from elsewhere (`vtc`,
  `vtc-predict`, `lcf`: `Capabilities.shares_counters`); other policies restore weights only;
- tenants no longer configured are left out; newly configured ones start from 0, lifted as usual.

A file that is not a snapshot stops the gateway at start with one line (move it away to start from 0).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from ...core import Ledger
from ..component import Part, cancelled


class HasWeights(Protocol):
    """A configuration (gateway/settings/config.py's): every node's weight, by path."""

    def weights(self) -> dict[str, float]: ...


log = logging.getLogger("fairserve.gateway")
FORMAT = "fairserve-gateway-snapshot/1"


def document(ledger: Ledger, configured: dict[str, float]) -> dict[str, Any]:
    """The snapshot of `ledger` (`configured`: each tenant's weight in the config, to tell admin changes apart)."""
    counter_of = ledger.policy.counter_of
    return {
        "format": FORMAT,
        "policy": ledger.policy.name,
        "saved_at": time.time(),
        "tenants": {
            t: {"weight": a.weight, "configured_weight": configured[t], "counter": counter_of(a), "service": a.service}
            for t, a in ledger.accounts.items()
            if t in configured
        },
        # NOTE: a group's weight only (its counter and service follow from its tenants', restored below)
        "groups": {
            g: {"weight": a.weight, "configured_weight": configured.get(g, 1.0)} for g, a in ledger.groups.items()
        },
    }


def write(path: str, doc: dict[str, Any]) -> None:
    """Replace `path` with `doc`, atomically."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _number(row: dict[str, Any], key: str) -> float:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{key} {v!r} is not a finite number >= 0")
    return float(v)


def restore(path: str, ledger: Ledger, configured: dict[str, float]) -> int:
    """Read `path` into `ledger`; returns how many tenants were restored (0 if there is no file yet). ValueError
    with one line if the file is not a snapshot, or no snapshot can be written there."""
    p = Path(path)
    if not p.exists():
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise ValueError(f"snapshot: cannot write {path}: {parent} is not a writable directory")
        return 0
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("tenants"), dict):
            raise ValueError(f"not a {FORMAT} file")
        rows = {t: r for t, r in doc["tenants"].items() if t in configured}
        if not all(isinstance(r, dict) for r in rows.values()):
            raise ValueError("a tenant's entry is not an object")
        checked = {
            t: (_number(r, "weight"), r.get("configured_weight"), _number(r, "counter"), _number(r, "service"))
            for t, r in rows.items()
        }
        groups = doc.get("groups", {})  # NOTE: absent from snapshots written before groups were kept
        if not isinstance(groups, dict) or not all(isinstance(r, dict) for r in groups.values()):
            raise ValueError("groups is not an object of objects")
        group_weights = {
            g: (_number(r, "weight"), r.get("configured_weight")) for g, r in groups.items() if g in ledger.groups
        }
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"snapshot {path} cannot be restored ({e}); move it away to start from 0") from None
    caps = ledger.policy.capabilities
    counters = caps.shares_counters and doc.get("policy") == ledger.policy.name
    weights = {t: (w, was) for t, (w, was, _, _) in checked.items()} | group_weights
    for node, (weight, was) in weights.items():
        current = ledger.node(node).weight
        if caps.uses_weights and was == configured.get(node, 1.0) and weight != current:
            try:
                ledger.set_weight(node, weight)
            except ValueError as e:
                raise ValueError(f"snapshot {path} cannot be restored ({e}); move it away to start from 0") from None
    for tenant, (_, _, counter, service) in checked.items():
        if counters:
            ledger.apply_remote(tenant, counter, service)
    if not counters and checked:
        log.warning(
            "snapshot %s: counters not restored (saved under policy %r; policy %r %s)",
            path,
            doc.get("policy"),
            ledger.policy.name,
            "cannot take counters" if not caps.shares_counters else "differs",
        )
    log.info("snapshot %s: restored %d tenants", path, len(checked))
    return len(checked)


class Snapshots(Part):
    """Restores at construction; from `start()` writes every `interval_s` (0: never), and once more at `stop()`. The
    tenants written are those of the configuration running then (a reload's, with the keys API's tenants)."""

    def __init__(self, path: str, ledger: Ledger, cfg: HasWeights, interval_s: float) -> None:
        self.path, self.ledger, self.cfg, self.interval_s = path, ledger, cfg, interval_s
        self.restored = restore(path, ledger, cfg.weights())
        self._task: asyncio.Task[None] | None = None

    def configure(self, cfg: HasWeights) -> None:
        """The configuration from now on (a reload): its weights are read at each write (O(tenants), as the write)."""
        self.cfg = cfg

    @property
    def configured(self) -> dict[str, float]:
        return self.cfg.weights()

    def save(self) -> bool:
        try:
            write(self.path, document(self.ledger, self.configured))
            return True
        except OSError as e:
            log.error("snapshot %s not written: %s", self.path, e)
            return False

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            doc = document(self.ledger, self.configured)  # NOTE: on the loop, so it is consistent; written off it
            try:
                await asyncio.to_thread(write, self.path, doc)
            except OSError as e:
                log.error("snapshot %s not written: %s", self.path, e)

    async def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """The periodic writes end; the last state is written (the requests have settled)."""
        task, self._task = self._task, None
        await cancelled(task)
        self.save()
