"""Policies by name. A policy is one module plus one `register(...)` call; every driver (the CLI, the gateway,
`serve`, the vLLM plugin) lists and builds policies from here: `make_policy("vtc")`, `make_policy("rpm:5")`,
`make_policy("vtc-predict:oracle±50")`.

A spec may end in engine options, `:name=value` each (`vtc:preempt=1000:running-cap=4000`): they say how the
simulated engine treats the running batch (fairness-triggered preemption, the per-tenant running-memory cap), not
how the policy orders. `split_options` takes them off; only the simulator accepts them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .cost import CostFunction, make_cost
from .policy import Capabilities, Policy

Build = Callable[[Any, CostFunction, int], Policy]  # (parsed argument or None, cost, seed) -> policy


@dataclass(frozen=True)
class PolicyEntry:
    name: str
    cls: type[Policy]
    summary: str
    argument: str | None = None  # the argument's name in `name:ARGUMENT` (None: the policy takes none)
    default: str | None = None  # the argument when the spec gives none
    parse: Callable[[str], Any] | None = None  # text -> argument value; ValueError for a bad one
    build: Build | None = None  # default: cls(cost=cost); a policy with an argument gives its own
    optional: bool = False  # without `default`, the argument may be left out: `build` gets None

    @property
    def capabilities(self) -> Capabilities:
        return self.cls.capabilities

    @property
    def usage(self) -> str:
        return f"{self.name}[:{self.argument}]" if self.argument else self.name


_REGISTRY: dict[str, PolicyEntry] = {}


def register(
    name: str,
    cls: type[Policy],
    summary: str,
    *,
    argument: str | None = None,
    default: str | None = None,
    parse: Callable[[str], Any] | None = None,
    build: Build | None = None,
    optional: bool = False,
) -> PolicyEntry:
    """Make a policy known by `name` (lower case). ValueError if the name is taken."""
    if name in _REGISTRY:
        raise ValueError(f"a policy named {name!r} is registered already")
    if argument is not None and build is None:
        raise ValueError(f"policy {name!r} takes an argument: register it with a `build`")
    entry = _REGISTRY[name] = PolicyEntry(name, cls, summary, argument, default, parse, build, optional)
    return entry


def unregister(name: str) -> None:
    """Forget a policy (tests that register their own)."""
    _REGISTRY.pop(name, None)


def _listed(entry: PolicyEntry, engine: bool, prefix_cache: bool) -> bool:
    caps = entry.capabilities
    return not (engine and caps.rejects_at_arrival) and (prefix_cache or not caps.uses_prefix_cache)


def policy_names(*, prefix_cache: bool = False) -> list[str]:
    """The registered names, in registration order; those that order by cached prefix (`lpm`, `dlpm`) only with
    `prefix_cache`: a driver without a prefix cache cannot run them."""
    return [name for name, e in _REGISTRY.items() if _listed(e, False, prefix_cache)]


def describe(*, engine: bool = False, prefix_cache: bool = False) -> str:
    """One line for --help texts: every registered policy, with its argument; with `engine`, only those an engine
    can run (they order, and never reject a request at arrival); those that order by cached prefix only with
    `prefix_cache` (the driver has one)."""
    return ", ".join(e.usage for e in _REGISTRY.values() if _listed(e, engine, prefix_cache))


ENGINE_OPTIONS: dict[str, type] = {"preempt": float, "preempt-max": int, "running-cap": int}  # docs/preemption.md
# NOTE: the vLLM plugin's own (docs/vllm.md); a number, so the options stay numbers: victim=counter|vllm is 1|0
VLLM_OPTIONS: dict[str, dict[str, int]] = {"preempt-priority": {"0": 0, "1": 1}, "victim": {"vllm": 0, "counter": 1}}


def split_options(spec: str) -> tuple[str, dict[str, float | int]]:
    """`name[:argument][:option=value]...` -> (the policy spec, the engine options by name, parsed). ValueError with
    one line on an unknown option or a bad value."""
    parts = spec.strip().split(":")
    keep = [parts[0]]
    options: dict[str, float | int] = {}
    for part in parts[1:]:
        key, eq, text = part.partition("=")
        if not eq:
            keep.append(part)
            continue
        key = key.strip().lower()
        if key in VLLM_OPTIONS:
            if text.strip().lower() not in VLLM_OPTIONS[key]:
                raise ValueError(f"engine option {key!r} in {spec!r}: choose from {'|'.join(VLLM_OPTIONS[key])}")
            options[key] = VLLM_OPTIONS[key][text.strip().lower()]
            continue
        if key not in ENGINE_OPTIONS:
            names = ", ".join([*ENGINE_OPTIONS, *VLLM_OPTIONS])
            raise ValueError(f"unknown engine option {key!r} in {spec!r}; choose from: {names}")
        kind = ENGINE_OPTIONS[key]
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"engine option {key!r} in {spec!r}: {text!r} is not {kind.__name__}") from None
        if not (value >= 0 if key == "preempt" else value >= 1):  # NOTE: NaN fails too
            raise ValueError(f"engine option {key!r} in {spec!r} must be {'>= 0' if key == 'preempt' else '>= 1'}")
        options[key] = value
    return ":".join(keep), options


@dataclass(frozen=True)
class PolicySpec:
    """A policy spec, parsed once: `text` as given, `policy` without its engine options, the registered `entry`, its
    parsed `argument` (None: the policy takes none) and the engine options (`split_options`). `parse_spec` makes
    one; `make_policy` builds from it without parsing again."""

    text: str
    policy: str
    entry: PolicyEntry
    argument: Any
    options: dict[str, float | int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.entry.name


def parse_spec(spec: str, *, engine_options: bool = False, prefix_cache: bool = False) -> PolicySpec:
    """Parse `name[:argument][:option=value]...` without building the policy. ValueError with one line naming the
    registered policies on a bad spec. Engine options (`split_options`) are accepted only with `engine_options`
    (the simulator's drivers), and must then suit the policy. A policy that orders by cached prefix is accepted only
    with `prefix_cache` (the driver has one: the simulator's paged engine with its cache on)."""
    policy, options = split_options(spec)
    if options and not engine_options:
        raise ValueError(
            f"engine options ({', '.join(options)}) apply to the engines that preempt: the simulated engine "
            "(fairserve simulate, sweep, reproduce, emulate) and the vLLM plugin"
        )
    name, _, arg = policy.strip().partition(":")
    entry = _REGISTRY.get(name.lower())
    if entry is None:
        raise ValueError(f"unknown policy {policy!r}; choose one of: {describe(prefix_cache=prefix_cache)}")
    if entry.capabilities.uses_prefix_cache and not prefix_cache:
        if engine_options:  # NOTE: the simulator's drivers: the flags that turn the cache on
            raise ValueError(
                f"policy {policy!r} orders by cached prefix and needs the prefix cache: "
                "--engine-mode paged --prefix-cache"
            )
        raise ValueError(
            f"policy {entry.name!r} orders by cached prefix and needs a driver with a prefix cache: "
            "fairserve simulate --engine-mode paged --prefix-cache (this driver has none)"
        )
    if "preempt" in options and not entry.capabilities.shares_counters:
        raise ValueError(f"preempt= compares tenants' counters: policy {entry.name!r} keeps none; use vtc")
    if entry.argument is None:
        if arg:
            raise ValueError(f"policy {entry.name!r} takes no argument (got {policy!r})")
        return PolicySpec(spec, policy, entry, None, options)
    text = arg or entry.default
    if text is None:
        if not entry.optional:
            raise ValueError(f"policy {entry.name!r} needs an argument: {entry.usage}")
        return PolicySpec(spec, policy, entry, None, options)  # NOTE: its build derives what was left out
    try:
        value = entry.parse(text) if entry.parse is not None else text
    except ValueError as e:
        raise ValueError(f"bad argument in policy {policy!r}: {e}") from None
    return PolicySpec(spec, policy, entry, value, options)


def check_policy(spec: str, *, engine_options: bool = False, prefix_cache: bool = False) -> tuple[PolicyEntry, Any]:
    """`parse_spec`'s (entry, parsed argument or None)."""
    parsed = parse_spec(spec, engine_options=engine_options, prefix_cache=prefix_cache)
    return parsed.entry, parsed.argument


def make_policy(
    spec: str | PolicySpec,
    *,
    cost: str | CostFunction | Callable[[int, int], float] | None = None,
    w_p: float = 1.0,
    w_q: float = 2.0,
    seed: int = 0,
    w_cached: float | None = None,
) -> Policy:
    """Build the policy `name[:argument]` (or a parsed `PolicySpec`, whose engine options are its driver's) with its
    cost function (`make_cost`). ValueError on a bad spec or cost.
    NOTE: a policy that orders by cached prefix is built here; its driver refuses it if it has no prefix cache."""
    parsed = spec if isinstance(spec, PolicySpec) else parse_spec(spec, prefix_cache=True)
    costfn = make_cost(cost, w_p, w_q, w_cached)
    entry = parsed.entry
    if entry.build is not None:
        return entry.build(parsed.argument, costfn, seed)
    return entry.cls(cost=costfn)


def number(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """A `parse` for numeric arguments: '{text!r} is not a number' on a bad one."""

    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None

    return parse
