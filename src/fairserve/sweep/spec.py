"""A sweep's grid, from a small TOML file and/or flags: the swept axes (policies, workloads or traces, KV pool sizes,
weights, seeds) and the options every run shares; `SweepConfig.points()` is one `Point` per run."""

from __future__ import annotations

import itertools
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..core import check_nodes, parse_weights
from ..sim.options import SimOptions
from ..sim.prefix_cache import DEFAULT_BLOCK_TOKENS
from ..sim.requests import MODES
from ..workloads import ALL_WORKLOADS, TRACE_FORMATS


class SweepError(ValueError):
    """A sweep that cannot run as given: one line for a human (the CLI prints it as `fairserve: error: ...`)."""


Weights = tuple[tuple[str, float], ...]  # (tenant or group path, weight), sorted; None: the workload's own
DEFAULT = "default"  # in `kv_tokens` and `weights`: the workload's own pool or weights
KEYS = (
    "policies",
    "workloads",
    "traces",
    "trace_format",
    "kv_tokens",
    "weights",
    "seeds",
    "duration",
    "cost",
    "w_p",
    "w_q",
    "engine_mode",
    "profile",
    "prefix_cache",
    "block_tokens",
    "w_cached",
)


@dataclass(frozen=True)
class Source:
    """Where a run's requests come from: a named workload, or a trace file."""

    kind: str  # "workload" | "trace"
    name: str  # the workload's name, or the trace's absolute path
    label: str  # shown in tables and figures: the name, or the path as given

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name}


@dataclass(frozen=True)
class Options:
    """What every run of a sweep shares: the workloads' length, the traces' format, and the engine's options (the
    `SimOptions` that `fairserve simulate` and `simulate()` take; each point sets its policy, pool and seed)."""

    duration_s: float | None = None  # named workloads only; traces run to their own length
    trace_format: str = "auto"
    engine: SimOptions = field(default_factory=SimOptions)

    def to_dict(self) -> dict[str, Any]:
        """As recorded in each run's spec (the run's identity): the keys of a sweep file; the options added since
        the first sweeps only where they differ from their default, so that runs stored before them keep their
        identity."""
        e = self.engine
        out: dict[str, Any] = {
            "duration_s": self.duration_s,
            "trace_format": self.trace_format,
            "cost": e.cost,
            "w_p": e.w_p,
            "w_q": e.w_q,
            "engine_mode": e.mode,
            "profile": e.latency,
        }
        later: dict[str, tuple[Any, Any]] = {
            "prefix_cache": (e.prefix_cache, False),
            "block_tokens": (e.block_tokens, DEFAULT_BLOCK_TOKENS),
            "w_cached": (e.w_cached, None),
            "engines": (e.engines, None),
            "dispatch": (e.dispatch, "least_loaded"),
            "autoscale": (e.autoscale, None),
            "scale_wait_s": (e.scale_wait_s, SimOptions.scale_wait_s),
            "scale_delay_s": (e.scale_delay_s, SimOptions.scale_delay_s),
            "scale_idle_s": (e.scale_idle_s, SimOptions.scale_idle_s),
        }
        return out | {k: v for k, (v, default) in later.items() if v != default}


@dataclass(frozen=True)
class Point:
    """One run of the grid."""

    policy: str
    source: Source
    kv_tokens: int | None  # None: the workload's pool
    weights: Weights | None
    seed: int
    options: Options

    def spec(self) -> dict[str, Any]:
        """Everything that decides the run's outcome, as JSON (with the workload file's hash: the run's identity)."""
        return {
            "policy": self.policy,
            "source": self.source.to_dict(),
            "kv_tokens": self.kv_tokens,
            "weights": [list(w) for w in self.weights] if self.weights is not None else None,
            "seed": self.seed,
            **self.options.to_dict(),
        }

    def sim_options(self) -> SimOptions:
        """The run's options for `simulate()`: the sweep's engine options with this point's policy, pool and seed."""
        return replace(self.options.engine, policy=self.policy, kv_tokens=self.kv_tokens, seed=self.seed)

    @property
    def group(self) -> tuple[str, str, str, str]:
        """The point without its seed, as labels: (policy, workload, kv_tokens, weights); a table row."""
        return (self.policy, self.source.label, kv_label(self.kv_tokens), weights_label(self.weights))


AXES = ("policy", "workload", "kv_tokens", "weights")  # the columns of `Point.group`


def kv_label(kv: int | None) -> str:
    return DEFAULT if kv is None else str(kv)


def weights_label(w: Weights | None) -> str:
    return DEFAULT if w is None else ",".join(f"{k}={v:g}" for k, v in w)


@dataclass(frozen=True)
class SweepConfig:
    policies: tuple[str, ...]
    workloads: tuple[str, ...] = ()
    traces: tuple[str, ...] = ()  # absolute paths
    trace_labels: tuple[str, ...] = ()  # the paths as given
    kv_tokens: tuple[int | None, ...] = (None,)
    weights: tuple[Weights | None, ...] = (None,)
    seeds: tuple[int, ...] = (0,)
    options: Options = field(default_factory=Options)

    @property
    def sources(self) -> list[Source]:
        return [Source("workload", w, w) for w in self.workloads] + [
            Source("trace", t, label) for t, label in zip(self.traces, self.trace_labels, strict=True)
        ]

    def points(self) -> list[Point]:
        """Policy-major grid order, seeds innermost (the table's order)."""
        return [
            Point(p, s, kv, w, seed, self.options)
            for p, s, kv, w, seed in itertools.product(
                self.policies, self.sources, self.kv_tokens, self.weights, self.seeds
            )
        ]

    @property
    def swept(self) -> list[str]:
        """The axes of `AXES` other than the policy with more than one value."""
        sizes = {"workload": len(self.sources), "kv_tokens": len(self.kv_tokens), "weights": len(self.weights)}
        return [a for a in AXES[1:] if sizes[a] > 1]

    def to_dict(self) -> dict[str, Any]:
        """The full configuration, as recorded in every result file (and readable back by `from_mapping`)."""
        return {
            "policies": list(self.policies),
            "workloads": list(self.workloads),
            "traces": list(self.traces),
            "kv_tokens": [DEFAULT if kv is None else kv for kv in self.kv_tokens],
            "weights": [weights_label(w) for w in self.weights],
            "seeds": list(self.seeds),
            "duration": self.options.duration_s,
            "trace_format": self.options.trace_format,
            "cost": self.options.engine.cost,
            "w_p": self.options.engine.w_p,
            "w_q": self.options.engine.w_q,
            "engine_mode": self.options.engine.mode,
            "profile": self.options.engine.latency,
            "prefix_cache": self.options.engine.prefix_cache,
            "block_tokens": self.options.engine.block_tokens,
            "w_cached": self.options.engine.w_cached,
        }


def seeds_text(seeds: tuple[int, ...]) -> str:
    """'0-49 (50 seeds)', or the list."""
    if len(seeds) > 2 and list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]} ({len(seeds)} seeds)"
    return ", ".join(map(str, seeds)) + f" ({len(seeds)} seed{'s' if len(seeds) != 1 else ''})"


def load_toml(path: str | Path) -> dict[str, Any]:
    """A sweep file's keys (see docs/sweeps.md), with trace paths made relative to the file's folder."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise SweepError(f"sweep file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SweepError(f"{path}: not a valid TOML file: {e}") from None
    unknown = [k for k in doc if k not in KEYS]
    if unknown:
        raise SweepError(f"{path}: unknown key {unknown[0]!r}; the keys are: {', '.join(KEYS)}")
    if "traces" in doc:
        doc["traces"] = [(str(p.parent / t), t) if isinstance(t, str) else t for t in _list(doc["traces"], "traces")]
    return doc


def from_mapping(values: Mapping[str, Any]) -> SweepConfig:
    """A checked `SweepConfig` from TOML-like values (lists, or comma-separated text; see docs/sweeps.md)."""
    policies = tuple(_names(values.get("policies"), "policies"))
    if not policies:
        raise SweepError("a sweep needs at least one policy (policies = [...] or --policy)")
    workloads = tuple(_names(values.get("workloads"), "workloads"))
    traces = [(t, t) if isinstance(t, str) else tuple(t) for t in _list(values.get("traces", []), "traces")]
    if not workloads and not traces:
        raise SweepError(
            "a sweep needs a workload or a trace (workloads = [...] or traces = [...]; --workload, --trace)"
        )
    options = _options(values)
    config = SweepConfig(
        policies=policies,
        workloads=workloads,
        traces=tuple(str(Path(t).resolve()) for t, _ in traces),
        trace_labels=tuple(label for _, label in traces),
        kv_tokens=tuple(_kv(v) for v in _list(values.get("kv_tokens", [DEFAULT]), "kv_tokens")),
        weights=tuple(_weights(v) for v in _list(values.get("weights", [DEFAULT]), "weights")),
        seeds=parse_seeds(values.get("seeds", 1)),
        options=options,
    )
    _check(config)
    return config


def parse_seeds(value: Any) -> tuple[int, ...]:
    """N (seeds 0 to N-1), "A-B" (A to B inclusive), or a list ("1,5,9" or [1, 5, 9]); seeds are integers >= 0."""
    bad = SweepError(f"seeds: expected N, A-B or a list of integers >= 0, got {value!r}")
    if isinstance(value, str) and "," not in value:
        a, dash, b = value.strip().partition("-")
        try:
            if dash:
                lo, hi = int(a), int(b)
                if not 0 <= lo <= hi:
                    raise bad
                return tuple(range(lo, hi + 1))
            value = int(a)
        except ValueError:
            raise bad from None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise SweepError(f"seeds: a count must be at least 1, got {value}")
        return tuple(range(value))
    items = _list(value, "seeds")
    try:
        seeds = tuple(int(s) for s in items if not isinstance(s, bool | float))
    except (TypeError, ValueError):
        raise bad from None
    if not seeds or len(seeds) != len(items) or min(seeds) < 0:
        raise bad
    _unique(seeds, "seeds")
    return seeds


def _list(value: Any, key: str) -> list[Any]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list | tuple):
        return list(value)
    raise SweepError(f"{key}: expected a list, got {value!r}")


def _names(value: Any, key: str) -> list[str]:
    names = _list(value if value is not None else [], key)
    if not all(isinstance(n, str) and n.strip() for n in names):
        raise SweepError(f"{key}: expected names, got {value!r}")
    names = [n.strip() for n in names]
    _unique(names, key)
    return names


def _unique(items: Any, key: str) -> None:
    seen: set[Any] = set()
    for item in items:
        if item in seen:
            raise SweepError(f"{key} lists {item!r} twice")
        seen.add(item)


def _kv(value: Any) -> int | None:
    if value == DEFAULT:
        return None
    try:
        kv = int(value) if not isinstance(value, bool | float) else math.nan
    except (TypeError, ValueError):
        kv = math.nan
    if not (isinstance(kv, int) and kv > 0):
        raise SweepError(f"kv_tokens: expected whole numbers of tokens > 0 or {DEFAULT!r}, got {value!r}")
    return kv


def _weights(value: Any) -> Weights | None:
    if value in (DEFAULT, "", None) or value == {}:
        return None
    if isinstance(value, Mapping):
        value = ",".join(f"{k}={v}" for k, v in value.items())
    if not isinstance(value, str):
        raise SweepError(f"weights: expected NODE=W,... text, a table or {DEFAULT!r}, got {value!r}")
    parsed = parse_weights(value, "weights")
    assert parsed is not None  # NOTE: non-empty text parses to a dict or raises
    return tuple(sorted(parsed.items()))


def _number(values: Mapping[str, Any], key: str, default: float | None) -> float | None:
    v = values.get(key, default)
    if v is None:
        return None
    try:
        x = float(v) if not isinstance(v, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise SweepError(f"{key}: expected a number > 0, got {v!r}")
    return x


def _options(values: Mapping[str, Any]) -> Options:
    fmt = values.get("trace_format", "auto")
    if fmt not in TRACE_FORMATS:
        raise SweepError(f"trace_format: expected one of {', '.join(TRACE_FORMATS)}, got {fmt!r}")
    given = values.get("engine_mode", "reserve")
    mode = next((m for m in MODES if m == given), None)
    if mode is None:
        raise SweepError(f"engine_mode: expected one of {', '.join(MODES)}, got {given!r}")
    w_p, w_q = _number(values, "w_p", 1.0), _number(values, "w_q", 2.0)
    assert w_p is not None and w_q is not None
    prefix_cache = values.get("prefix_cache", False)
    if not isinstance(prefix_cache, bool):
        raise SweepError(f"prefix_cache: expected true or false, got {prefix_cache!r}")
    block = values.get("block_tokens", DEFAULT_BLOCK_TOKENS)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise SweepError(f"block_tokens: expected a whole number of tokens > 0, got {block!r}")
    w_cached = values.get("w_cached")
    if w_cached is not None and (isinstance(w_cached, bool) or not isinstance(w_cached, int | float) or w_cached < 0):
        raise SweepError(f"w_cached: expected a number >= 0, got {w_cached!r}")
    fleet = _fleet(values)
    engine = SimOptions(
        **fleet,
        cost=str(values.get("cost", "linear")),
        w_p=w_p,
        w_q=w_q,
        w_cached=None if w_cached is None else float(w_cached),
        mode=mode,
        latency=values.get("profile"),
        prefix_cache=prefix_cache,
        block_tokens=block,
    )
    return Options(duration_s=_number(values, "duration", None), trace_format=fmt, engine=engine)


def _fleet(values: Mapping[str, Any]) -> dict[str, Any]:
    """The fleet's keys (`engines`, `dispatch`, `autoscale`, `scale_wait_s`, `scale_delay_s`, `scale_idle_s`),
    typed; their values are checked with the engine's options."""
    out: dict[str, Any] = {}
    engines = values.get("engines")
    if engines is not None:
        if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
            raise SweepError(f"engines: expected a whole number of engines > 0, got {engines!r}")
        out["engines"] = engines
    for key in ("dispatch", "autoscale"):
        if values.get(key) is not None:
            if not isinstance(values[key], str):
                raise SweepError(f"{key}: expected a string, got {values[key]!r}")
            out[key] = values[key]
    for key in ("scale_wait_s", "scale_delay_s", "scale_idle_s"):
        v = values.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise SweepError(f"{key}: expected a number of seconds >= 0, got {v!r}")
            out[key] = float(v)
    return out


def _check(config: SweepConfig) -> None:
    """Every name and value is checked before the first (slow) run."""
    opts = config.options
    for spec in config.policies:
        replace(opts.engine, policy=spec).check()  # NOTE: engine options and the prefix cache as `simulate` takes them
    for name in config.workloads:
        if name not in ALL_WORKLOADS:
            raise SweepError(f"unknown workload {name!r}; valid names: {', '.join(ALL_WORKLOADS)}")
    for path, label in zip(config.traces, config.trace_labels, strict=True):
        if not Path(path).is_file():
            raise SweepError(f"trace file not found: {label}")
    _unique(config.kv_tokens, "kv_tokens")
    _unique(config.weights, "weights")
    given = [w for w in config.weights if w is not None]
    if given:
        from .work import load_workload  # NOTE: builds each source once, for its tenant names

        for source in config.sources:
            tenants = {a.client for a in load_workload(source, config.seeds[0], opts).arrivals}
            for w in given:
                check_nodes(tenants, [k for k, _ in w], f"weights ({source.label})")
