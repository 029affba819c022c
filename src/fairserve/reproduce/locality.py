"""Locality-aware fairness (Cao et al. 2025, arXiv 2501.14312): VTC, LPM (longest cached prefix first) and DLPM
(deficit longest prefix match) on the paged engine with its prefix cache (sim/cached.py), on the workloads with shared
prefixes (workloads/prefixed.py). The throughput curve over pool size on `system-prompts` (8 clients, each with its
own 1,000-token system prompt), from a pool that holds 2 of the 8 prompts to one that holds 12; the goals: DLPM at
>= 2x VTC's throughput where the pool holds at most half the prompts, its largest backlogged difference within its
bound 2·(Q + w_p·L_in + w_q·M) (docs/architecture.md, "DLPM's bound"), LPM's worst client's median time to first
token >= 3x DLPM's on the same runs, and DLPM within 5% of VTC's throughput where nothing is shared. These are our
own findings (the paper's numbers are not at hand: its abstract reports up to 2.87x VTC's throughput)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.dlpm import QUANTUM_REQUESTS
from ..sim import hit_rate
from .runs import RunOutput, RunSpec
from .verdicts import Results, Verdict

SECTION = "Locality-aware fairness (Cao et al. 2025)"
SOURCE = "beyond the paper (Cao et al., Locality-aware Fair Scheduling in LLM Serving, arXiv 2501.14312)"
QUANTUM = 5000  # about 4.4 requests' service (1,064 prompt + 2 × 32 output): a client runs a few while it is cached
DLPM, LPM, VTC = f"dlpm:{QUANTUM}", "lpm", "vtc"
TYPED = "dlpm"  # as a user types it: the quantum derived from the requests (core/dlpm.py, QUANTUM_REQUESTS)
POLICIES = (VTC, LPM, DLPM, TYPED)
DURATION_S = 30
CLIENTS, SYSTEM, QUESTION, OUTPUT = 8, 1000, 64, 32
PER_CLIENT = SYSTEM + QUESTION + OUTPUT  # the pool one client's running request holds, its system prompt included
HELD = (2, 4, 6, 8, 12)  # the curve's pools, in clients' prompts they hold
THROUGHPUT_GOAL, TTFT_GOAL, NO_SHARING_GOAL = 2.0, 3.0, 0.95
CURVE, NO_SHARING = f"system-prompts@{DURATION_S}s", f"no-sharing@{DURATION_S}s"
OTHERS = tuple(f"{w}@{DURATION_S}s" for w in ("conversations", "document", "prefix-mix"))
OTHERS_HELD = 4  # the other workloads' pool: half the clients' prompts
W_CACHED: float | None = None  # every run's price of a cached prompt token (None: w_p = 1, the paper's service)


def spec(workload: str, policy: str, held: int) -> RunSpec:
    label = f"{policy} @ {held} prompts"
    kv = held * PER_CLIENT
    return RunSpec(workload, policy, mode="paged", kv_tokens=kv, prefix_cache=True, label=label, w_cached=W_CACHED)


def curve_runs() -> tuple[RunSpec, ...]:
    return tuple(spec(CURVE, p, h) for h in HELD for p in POLICIES)


def worst_median_ttft(o: RunOutput) -> float:
    """The largest per-client median time to first token; a request never admitted counts the time to the run's end
    (a lower bound on its wait)."""
    waits: dict[str, list[float]] = {}
    for r in o.records:
        first = r.first_token_s if r.first_token_s is not None else o.duration_s
        waits.setdefault(r.client, []).append(first - r.arrival_s)
    return max(float(np.median(w)) for w in waits.values())


def never_admitted(o: RunOutput) -> tuple[int, int]:
    """(requests never admitted, requests) of the client with the most never admitted."""
    counts: dict[str, list[int]] = {}
    for r in o.records:
        c = counts.setdefault(r.client, [0, 0])
        c[0] += r.admit_s is None
        c[1] += 1
    worst = max(counts.values())
    return worst[0], worst[1]


def overload_ceiling(left: int, sent: int) -> str:
    """Where DLPM too is overloaded, its worst client's waits grow with the run at about the share of requests it
    leaves waiting, (left / sent) per second, while a client LPM never admits waits the whole time: the ratio of the
    two medians tends to about sent / left, however long the run."""
    return f"the ratio tends to about {sent / left:.1f}× under overload" if left else "DLPM keeps up"


def most_running_output(o: RunOutput) -> int:
    """M of the bound, from above: the most output tokens (max_tokens) of requests admitted and not yet finished at
    any admission (a preempted request counts as running from its first admission to its finish)."""
    events = []
    for r in o.records:
        if r.admit_s is not None:
            events.append((r.admit_s, 1, r.max_tokens))
            events.append((r.finish_s if r.finish_s is not None else float("inf"), 0, -r.max_tokens))
    events.sort()
    running = most = 0
    for _, _, tokens in events:
        running += tokens
        most = max(most, running)
    return most


def dlpm_bound(o: RunOutput) -> float:
    """2·(Q + w_p·L_in + w_q·M) with the linear cost's w_p = 1, w_q = 2 (a cached prompt token priced above w_p
    raises w_p·L_in to w_cached·L_in)."""
    w_p = max(1.0, o.spec.w_cached or 0.0)
    return 2.0 * (QUANTUM + w_p * o.max_prompt + 2 * most_running_output(o))


def _hit(o: RunOutput) -> float:
    assert o.cached_tokens is not None
    return hit_rate(o.records, o.cached_tokens)


def _row(res: Results, workload: str, held: int) -> dict[str, RunOutput]:
    return {p: res[workload, spec(workload, p, held).name] for p in POLICIES}


def _point(runs: dict[str, RunOutput]) -> str:
    vtc = runs[VTC].summary.service_per_s
    return ", ".join(
        f"{p} {o.summary.service_per_s:,.0f}/s ({o.summary.service_per_s / vtc:.2f}×, hit {_hit(o):.0%})"
        for p, o in runs.items()
    )


def _throughput(res: Results) -> Verdict:
    lines, ratios, within, typed = [], [], [], []
    for held in HELD:
        runs = _row(res, CURVE, held)
        ratio = runs[DLPM].summary.service_per_s / runs[VTC].summary.service_per_s
        diff, bound = runs[DLPM].summary.max_backlogged_diff, dlpm_bound(runs[DLPM])
        within.append(diff <= bound)
        if held <= CLIENTS // 2:
            ratios.append(ratio)
            typed.append(runs[TYPED].summary.service_per_s / runs[VTC].summary.service_per_s)
        lines.append(f"{held} of {CLIENTS} prompts: {_point(runs)}; DLPM's difference {diff:,.0f} (bound {bound:,.0f})")
    holds = all(r >= THROUGHPUT_GOAL for r in ratios) and all(within)
    ours = (
        f"DLPM {', '.join(f'{r:.2f}×' for r in ratios)} VTC's throughput where the pool holds "
        f"{', '.join(str(h) for h in HELD if h <= CLIENTS // 2)} of {CLIENTS} prompts; its difference within the "
        f"bound in {sum(within)} of {len(within)} runs; `{TYPED}` as typed (its quantum derived) "
        f"{', '.join(f'{r:.2f}×' for r in typed)}"
    )
    return holds, "service per second (w_p·prompt + w_q·output) and hit rate per run: " + "; ".join(lines), ours


def _starvation(res: Results) -> Verdict:
    lines, judged = [], []
    for held in HELD:
        runs = _row(res, CURVE, held)
        lpm, dlpm, vtc = (worst_median_ttft(runs[p]) for p in (LPM, DLPM, VTC))
        ratio = lpm / dlpm if dlpm else float("inf")
        if held <= CLIENTS // 2:
            judged.append(ratio)
        starved, sent = never_admitted(runs[LPM])
        left, _ = never_admitted(runs[DLPM])
        lines.append(
            f"{held} prompts: LPM {lpm:.1f} s ({starved} of a client's {sent} requests never admitted), "
            f"DLPM {dlpm:.1f} s ({ratio:.1f}×; {left} never admitted: {overload_ceiling(left, sent)}), VTC {vtc:.1f} s"
        )
    holds = all(r >= TTFT_GOAL for r in judged)
    ours = f"LPM's worst client waits {', '.join(f'{r:.1f}×' for r in judged)} DLPM's worst (pools ≤ half)"
    return (
        holds,
        "worst client's median time to first token (a request never admitted counts the time to the run's end, a "
        "lower bound on its wait): " + "; ".join(lines),
        ours,
    )


def _no_sharing(res: Results) -> Verdict:
    runs = _row(res, NO_SHARING, OTHERS_HELD)
    ratio = runs[DLPM].summary.service_per_s / runs[VTC].summary.service_per_s
    evidence = f"{OTHERS_HELD} prompts' pool, nothing shared: {_point(runs)}"
    return ratio >= NO_SHARING_GOAL, evidence, f"DLPM at {ratio:.3f}× VTC's throughput"


def _others(res: Results) -> Verdict:
    lines, ok, ratios = [], True, []
    for w in OTHERS:
        runs = _row(res, w, OTHERS_HELD)
        d = runs[DLPM]
        ratio = d.summary.service_per_s / runs[VTC].summary.service_per_s
        ratios.append(f"{w.split('@')[0]} {ratio:.2f}×")
        within = d.summary.max_backlogged_diff <= dlpm_bound(d)
        ok = ok and ratio >= NO_SHARING_GOAL and within
        ttft = ", ".join(f"{p} {worst_median_ttft(o):.1f} s" for p, o in runs.items())
        diffs = ", ".join(f"{p} {o.summary.max_backlogged_diff:,.0f}" for p, o in runs.items())
        lines.append(
            f"{w}: {_point(runs)}; worst median TTFT {ttft}; largest backlogged difference {diffs} "
            f"(DLPM's bound {dlpm_bound(d):,.0f})"
        )
    return ok, "; ".join(lines), "DLPM vs VTC throughput: " + ", ".join(ratios)


def curve_figure(outs: list[RunOutput]):
    """Throughput / VTC's against the prompts the pool holds, a line for DLPM and for LPM."""
    by_name = {o.spec.name: o for o in outs}
    lines: dict[str, list[tuple[str, float, float]]] = {DLPM: [], LPM: []}
    for held in HELD:
        vtc = by_name[spec(CURVE, VTC, held).name].summary.service_per_s
        for p in lines:
            o = by_name[spec(CURVE, p, held).name]
            lines[p].append((f"hit {_hit(o):.0%}", float(held), o.summary.service_per_s / vtc))
    return {"system-prompts": lines}


def _scope(what: str) -> str:
    return (
        f"paged engine with the prefix cache (16-token blocks), Llama-2-7b on an A10G (profiled); {what}; "
        f"{CLIENTS} clients × 1 request/s, {SYSTEM}-token prompts + {QUESTION}-token questions, {OUTPUT} output "
        f"tokens, {DURATION_S} s; VTC, LPM and DLPM (quantum {QUANTUM:,}, and `{TYPED}` as typed: "
        f"{QUANTUM_REQUESTS} times the largest request's service); service = prompt + 2 × output"
        + ("" if W_CACHED is None else f", a cached prompt token {W_CACHED:g}")
    )


Rule = Callable[[Results], Verdict]
EXPERIMENTS: tuple[tuple[str, str, str, tuple[RunSpec, ...], Rule, str, tuple[str, str]], ...] = (
    (
        "locality-throughput",
        "Private system prompts: throughput over pool size",
        f"Does DLPM reach ≥ {THROUGHPUT_GOAL:g}× VTC's throughput where the pool holds at most half the clients' "
        "system prompts, with its largest backlogged difference within its bound 2·(Q + w_p·L_in + w_q·M)?",
        curve_runs(),
        _throughput,
        _scope(f"pools holding {', '.join(map(str, HELD))} of the {CLIENTS} prompts"),
        (f"DLPM ≥ {THROUGHPUT_GOAL:g}× VTC where the pool is small, bounded?", "8 private system prompts"),
    ),
    (
        "locality-starvation",
        "Private system prompts: LPM's starvation tail",
        f"On the same runs, is LPM's worst client's median time to first token ≥ {TTFT_GOAL:g}× DLPM's worst where "
        "the pool holds at most half the prompts?",
        curve_runs(),
        _starvation,
        _scope("the curve's runs"),
        (f"LPM's worst TTFT ≥ {TTFT_GOAL:g}× DLPM's?", "8 private system prompts"),
    ),
    (
        "locality-no-sharing",
        "Nothing shared: DLPM's cost",
        f"Where no prompts share a prefix, is DLPM within {1 - NO_SHARING_GOAL:.0%} of VTC's throughput?",
        tuple(spec(NO_SHARING, p, OTHERS_HELD) for p in POLICIES),
        _no_sharing,
        _scope(f"no-sharing (every prompt its own), a pool of {OTHERS_HELD * PER_CLIENT:,} tokens"),
        (f"DLPM within {1 - NO_SHARING_GOAL:.0%} of VTC?", "no shared prefixes"),
    ),
    (
        "locality-workloads",
        "Conversations, one document, a mix",
        "On multi-turn conversations, one document asked by every client and a mix of sharing and non-sharing "
        "clients, does DLPM serve at least VTC's throughput (within 5%) with its difference within its bound?",
        tuple(spec(w, p, OTHERS_HELD) for w in OTHERS for p in POLICIES),
        _others,
        _scope(f"conversations (4 turns), document, prefix-mix; a pool of {OTHERS_HELD * PER_CLIENT:,} tokens"),
        ("DLPM ≥ VTC, bounded?", "conversations, document, mix"),
    ),
)
