"""A sync's wire format, described once: what a replica sends the sync script (`redis_scripts.py`, its ARGV) and
what the script answers, as named dataclasses with one encoder and one decoder each.

The layout: ARGV starts with `BatchHead`'s fields, one argument each, in the order of its fields; then come the
`SECTIONS`, in their order, each a count and that many rows (a row is its dataclass's fields, in order; a node name
where the section has no row class), or one argument (`starved`: "" or a JSON list, flat). The answer is the
`ANSWER` parts, in order; its flat lists hold rows of `Floor`, `WaitingHead` and `Lease`.

Nothing else lays them out: `encode` and `SyncAnswer.decode` walk these classes, and the script reads its arguments
at the places `bind` fills in from them (`$head.FIELD`: an ARGV index; `$SECTION.FIELD`: a field's offset in its
row; `$SECTION.width`: a row's length; `$answer.PART`: a part's index in the answer), so a field moved here moves in
the script too. `decode` (ARGV back into a batch) and `SyncAnswer.encode` (an answer as the script returns it) are
the script's side in Python, for tests and tools."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cache
from operator import attrgetter
from typing import Any

Arg = str | int | float  # an argument as the link sends it (it writes each as the Redis client would)

WHOLE, CHANGES, LEAVE = "=", "+", "leave"  # `BatchHead.mode`: the whole backlog, its changes, or leaving


@dataclass(frozen=True, slots=True)
class BatchHead:
    """The arguments at fixed places, ARGV[1] onwards in this order."""

    prefix: str  # the key prefix `P`
    replica: str
    ttl_ms: int  # a silent replica's leases and backlog stop counting after this long
    hold_ms: int  # how long no lease grows after Redis lost its data
    now_ms: int | None  # the time expiries are measured in: a test's clock; None for Redis's own
    # what this replica last read: the data's epoch (set when Redis starts it; another one: Redis lost its data) and
    # two change numbers (`P:seq` counts every change to a node's counter, service or weight, `P:wseq` the weights
    # set by an admin); the answer carries the changes after them, at most `pull` nodes, the oldest first, and every
    # weight set since; everything when the epoch differs
    epoch: str
    since: str
    weights_since: str
    pull: int
    # "TOKEN:N", the replica's number for the charges, weights and reset it carries: applied only if N is above the
    # number last applied for TOKEN (`P:sn`), so a batch sent again after a lost answer never charges twice
    batch: str
    reset: bool  # every counter to 0
    mode: str  # WHOLE: `backlogged` lists the whole backlog here; CHANGES: those newly backlogged; LEAVE
    lifts: bool  # the policy lifts counters (the lift below the top of the tree, in Redis)


@dataclass(frozen=True, slots=True)
class Charge:
    """What a batch charges a node (tenant or group), and its values before (what Redis starts from if it has none)."""

    node: str
    service: float
    counter: float  # the service over the node's weight
    lift: float | None  # the counter it is lifted to before the charge (None: no lift)
    base_counter: float
    base_service: float


@dataclass(frozen=True, slots=True)
class Weight:
    """A node's weight (an admin's, or a configured one seeded where Redis has none)."""

    tenant: str
    weight: float


@dataclass(frozen=True, slots=True)
class StarvedHead:
    """A pool whose head here may be admitted but finds no lease with room: the head's tenant, and the pool (its
    backends' URLs, sorted, space-separated)."""

    tenant: str
    pool: str


@dataclass(frozen=True, slots=True)
class LeaseAsk:
    """What a replica asks of one backend's capacity, in requests and tokens (limit 0: no token limit). `need` is in
    use plus the queued demand the replica may admit now; `spare` headroom beyond it, granted only from capacity no
    other replica waits for; `keep` the limit it admits within while this sync is in flight: the new lease is never
    below it, or below the old lease, whichever is smaller."""

    url: str
    limit_requests: int
    limit_tokens: int
    used_requests: int
    used_tokens: int
    need_requests: int
    need_tokens: int
    spare_requests: int
    spare_tokens: int
    keep_requests: int
    keep_tokens: int


@dataclass(frozen=True, slots=True)
class Section:
    """A part of ARGV after the head: a count and its rows (`row`'s fields; a node name where `row` is None), or
    with `single` one argument, "" or a JSON list of the rows, flat."""

    name: str  # the batch's field, and the script's `-- ARGV section: NAME`
    row: type | None
    single: bool = False

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.row)) if self.row is not None else ()


SECTIONS = (
    Section("charges", Charge),
    Section("weights", Weight),  # set by an admin
    Section("seeds", Weight),  # configured: set only where Redis has none
    Section("backlogged", None),  # nodes now backlogged here (mode WHOLE: all of them)
    Section("unbacklogged", None),  # nodes no longer backlogged here
    Section("starved", StarvedHead, single=True),
    Section("backends", LeaseAsk),
)
HEAD = tuple(f.name for f in fields(BatchHead))


@dataclass(frozen=True, slots=True)
class SyncBatch:
    """One sync's ARGV: the head, then a field per section (`SECTIONS`)."""

    head: BatchHead
    charges: Sequence[Charge] = ()
    weights: Sequence[Weight] = ()
    seeds: Sequence[Weight] = ()
    backlogged: Sequence[str] = ()
    unbacklogged: Sequence[str] = ()
    starved: Sequence[StarvedHead] = ()
    backends: Sequence[LeaseAsk] = ()


def _arg(v: Any) -> Arg:
    if v is None:
        return ""
    if v is True or v is False:
        return "1" if v else "0"
    return v


def _getter(cls: Any) -> tuple[Any, bool]:
    """A row's values in its fields' order (one call), and whether any of them needs `_arg` (None, a bool)."""
    fs = fields(cls)
    return attrgetter(*(f.name for f in fs)), any(f.type not in ("str", "int", "float") for f in fs)


# NOTE: per class, once: a sync lays out a few dozen rows, and Python's work per row is what it costs here
_GET = {cls: _getter(cls) for cls in (BatchHead, *(s.row for s in SECTIONS if s.row is not None))}


def row_args(row: Any) -> list[Arg]:
    """One row's arguments (a `Charge`, a `LeaseAsk`, ...), in its fields' order."""
    get, mixed = _GET[type(row)]
    return list(map(_arg, get(row))) if mixed else list(get(row))


def encode(batch: SyncBatch) -> list[Arg]:
    """The script's ARGV for `batch`, in the layout above."""
    out = row_args(batch.head)
    for s in SECTIONS:
        rows = getattr(batch, s.name)
        if s.single:
            out.append(json.dumps([x for r in rows for x in row_args(r)]) if rows else "")
            continue
        out.append(len(rows))
        if s.row is None:
            out.extend(rows)
            continue
        get, mixed = _GET[s.row]
        for r in rows:
            out.extend(map(_arg, get(r)) if mixed else get(r))
    return out


def leave(prefix: str, replica: str, token: str) -> list[Arg]:
    """The script's ARGV for leaving: the head alone, mode LEAVE and `batch` the replica's token (the numbers of its
    batches are forgotten), the other places empty."""
    given = {"prefix": prefix, "replica": replica, "batch": token, "mode": LEAVE}
    return [given.get(name, "") for name in HEAD]


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _optional(kind: Any) -> Any:
    return lambda v: None if v in ("", b"") else kind(v)


_READ = {  # a field's type (as written on its class) -> how its argument or answer item is read back
    "str": _text,
    "int": int,
    "float": float,
    "bool": lambda v: bool(int(v)),
    "int | None": _optional(int),
    "float | None": _optional(float),
}


@cache
def _readers(cls: Any) -> tuple[Any, ...]:
    return tuple(_READ[str(f.type)] for f in fields(cls))


def _row(cls: Any, items: Sequence[Any]) -> Any:
    return cls(*[read(v) for read, v in zip(_readers(cls), items, strict=True)])


def _rows(cls: Any, flat: Sequence[Any]) -> tuple[Any, ...]:
    n = len(_readers(cls))
    if len(flat) % n:
        raise ValueError(f"{len(flat)} items are not rows of {n} ({cls.__name__})")
    return tuple(_row(cls, flat[k : k + n]) for k in range(0, len(flat), n))


def decode(args: Sequence[Any]) -> SyncBatch:
    """`encode`'s inverse: a batch from its ARGV (as the script reads it)."""
    head = _row(BatchHead, args[: len(HEAD)])
    i, sections = len(HEAD), {}
    for s in SECTIONS:
        if s.single:
            sections[s.name] = _rows(s.row, json.loads(args[i])) if args[i] not in ("", b"") else ()
            i += 1
            continue
        n, width = int(args[i]), len(s.fields) or 1
        flat = args[i + 1 : i + 1 + n * width]
        sections[s.name] = tuple(_text(x) for x in flat) if s.row is None else _rows(s.row, flat)
        i += 1 + n * width
    return SyncBatch(head, **sections)


@dataclass(frozen=True, slots=True)
class NodeValues:
    """A node's global counter and service (both None: Redis holds none for it yet)."""

    node: str
    counter: float | None
    service: float | None


@dataclass(frozen=True, slots=True)
class Floor:
    """A node backlogged at the top of the tree on some live replica, and its counter (as ZRANGE WITHSCORES gives)."""

    node: str
    counter: float


@dataclass(frozen=True, slots=True)
class WaitingHead:
    """Another live replica's head that waits for capacity: its tenant, its global counter, its pool."""

    tenant: str
    counter: float
    pool: str


@dataclass(frozen=True, slots=True)
class Lease:
    """A backend's new lease for this replica, and whether other replicas wait for its capacity (per `LeaseAsk`)."""

    requests: int
    others_wait_requests: bool
    tokens: int
    others_wait_tokens: bool


# The answer's parts, in order: the nodes whose values it carries (charged or newly backlogged here, backlogged here
# and charged elsewhere, the groups above other replicas' waiting heads, those changed since `since`) and their
# "COUNTER SERVICE" values (nil where unset); the tenants whose weight was set since `weights_since` and their
# weights; `Floor` rows (the two smallest counters backlogged at the top on any live replica); `WaitingHead` rows;
# `Lease` rows (one per `LeaseAsk`); the live replicas; the epoch and change numbers read up to; the generation of
# counter resets; known (0: Redis had forgotten this replica, and with it its backlog).
ANSWER = (
    "tenants", "values", "weighted", "weights", "floor", "starved", "leases", "replicas", "epoch",
    "since", "weights_since", "generation", "known",
)  # fmt: skip
AT = {part: k for k, part in enumerate(ANSWER)}  # a part's place in the answer (0-based)
ROWS = {"floor": Floor, "waiting": WaitingHead, "lease": Lease}  # the answer's rows, as the script names them


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    """The sync script's answer, decoded."""

    nodes: tuple[NodeValues, ...]
    weights: tuple[Weight, ...]  # those set since `weights_since` (one deleted by hand meanwhile is left out)
    floor: tuple[Floor, ...]
    waiting: tuple[WaitingHead, ...]
    leases: tuple[Lease, ...]  # one per backend of the batch, in its order
    replicas: int
    epoch: str
    since: str
    weights_since: str
    generation: str
    known: bool

    @classmethod
    def decode(cls, reply: Sequence[Any]) -> SyncAnswer:
        r = dict(zip(ANSWER, reply, strict=True))
        nodes = []
        for t, v in zip(r["tenants"], r["values"], strict=True):
            name = t.decode() if isinstance(t, bytes) else str(t)
            if v is None:
                nodes.append(NodeValues(name, None, None))
            else:
                c, s = (v.decode() if isinstance(v, bytes) else str(v)).split(" ")
                nodes.append(NodeValues(name, float(c), float(s)))
        weights = tuple(
            Weight(_text(t), float(w)) for t, w in zip(r["weighted"], r["weights"], strict=True) if w is not None
        )
        return cls(
            tuple(nodes),
            weights,
            _rows(Floor, r["floor"]),
            _rows(WaitingHead, r["starved"]),
            _rows(Lease, r["leases"]),
            int(r["replicas"]),
            _text(r["epoch"]),
            _text(r["since"]),
            _text(r["weights_since"]),
            _text(r["generation"]),
            bool(int(r["known"])),
        )

    def encode(self) -> list[Any]:
        """The answer as the script returns it (`decode`'s inverse)."""

        def flat(rows: Sequence[Any]) -> list[Any]:
            return [_arg(getattr(x, f.name)) for x in rows for f in fields(x)]

        parts = {
            "tenants": [n.node for n in self.nodes],
            "values": [None if n.counter is None else f"{n.counter!r} {n.service!r}" for n in self.nodes],
            "weighted": [w.tenant for w in self.weights],
            "weights": [repr(w.weight) for w in self.weights],
            "floor": flat(self.floor),
            "starved": flat(self.waiting),
            "leases": flat(self.leases),
            "replicas": self.replicas,
            "epoch": self.epoch,
            "since": self.since,
            "weights_since": self.weights_since,
            "generation": self.generation,
            "known": int(self.known),
        }
        return [parts[p] for p in ANSWER]


_PLACE = re.compile(r"\$([a-z_]+)\.([a-z_]+)")


def _place(section: str, name: str) -> int:
    """What `$section.name` in the script stands for (see the module's docstring); KeyError for a name not here."""
    if section == "head":
        return len(HEAD) if name == "width" else HEAD.index(name) + 1
    if section == "answer":
        return ANSWER.index(name) + 1
    by_name = {s.name: s.row for s in SECTIONS if s.row is not None} | ROWS
    names = tuple(f.name for f in fields(by_name[section]))
    return len(names) if name == "width" else names.index(name)


def placeholders(template: str) -> list[tuple[str, str]]:
    """The `$section.name` places a script's text reads, in order."""
    return _PLACE.findall(template)


def bind(template: str) -> str:
    """The script's text with each `$section.name` replaced by its place in the layout; ValueError for one unknown."""

    def sub(m: re.Match[str]) -> str:
        try:
            return str(_place(m[1], m[2]))
        except (KeyError, ValueError):
            raise ValueError(f"the sync script reads {m[0]}, which the layout has not") from None

    return _PLACE.sub(sub, template)


def describe() -> str:
    """The layout in one Lua comment, for the head of the script's text (what Redis and its SCRIPT commands show)."""
    parts = [f"{s.name}: " + ("one (\"\" or JSON, flat: " if s.single else "n x (") + (", ".join(s.fields) or "node")
             + ")" for s in SECTIONS]  # fmt: skip
    rows = "; ".join(f"{k}: {', '.join(f.name for f in fields(c))}" for k, c in ROWS.items())
    return (
        f"-- ARGV (gateway/shared/codec.py): {', '.join(HEAD)}; then {'; '.join(parts)}\n"
        f"-- answer: {', '.join(ANSWER)} (rows: {rows})\n"
    )
