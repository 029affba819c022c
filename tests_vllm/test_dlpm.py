"""DLPM inside vLLM's CPU build, over vLLM's own prefix cache (`FAIRSERVE_POLICY=dlpm:600`, `enable_prefix_caching`):
four tenants with private 224-token system prompts, six requests each, queued together in a pool of 23 blocks of
32 tokens (each request holds 8; the four system prompts together need 28). Against VTC on the same engine
settings, on the engine's own steps as the clock:

- DLPM serves a tenant's requests while its system prompt is cached: vLLM's own hit rate is higher and its prefill
  computes fewer tokens, so the whole takes fewer engine steps;
- every tenant is charged exactly w_p·(x − c) + w_cached·c + w_q·y per request, c being vLLM's own
  `num_cached_tokens` (FAIRSERVE_W_CACHED=0.25), under DLPM and VTC alike;
- DLPM's deficit bound holds between backlogged tenants (docs/architecture.md, "DLPM's bound")."""

from __future__ import annotations

import pytest
from engine import W_P, W_Q, Job, drive, scheduler_of

TENANTS, EACH = 4, 6
SYSTEM, PROMPT, OUTPUT = 224, 240, 8
W_CACHED, QUANTUM = 0.25, 600.0
POOL_TOKENS = 23 * 32

JOBS = [
    Job(f"t{k}-{j}", f"t{k}", PROMPT, OUTPUT, seed=100 * k + j, system=(SYSTEM, 1000 + k))
    for j in range(EACH)
    for k in range(TENANTS)
]  # interleaved: t0-0, t1-0, t2-0, t3-0, t0-1, ...


@pytest.fixture(scope="module")
def runs(engines) -> dict:
    out = {}
    for name in ("dlpm", "vtc-prefix"):
        llm = engines.get(name)
        llm.reset_prefix_cache()
        out[name] = drive(llm, JOBS), scheduler_of(llm)
    return out


def hit_rate(run) -> float:
    return sum(run.cached.values()) / (PROMPT * len(JOBS))


def test_dlpm_finds_more_of_the_prompts_in_vllms_cache_and_finishes_sooner(runs):
    dlpm, _ = runs["dlpm"]
    vtc, _ = runs["vtc-prefix"]
    for run in (dlpm, vtc):
        assert run.outputs == {job.rid: OUTPUT for job in JOBS}
    assert hit_rate(dlpm) > hit_rate(vtc) + 0.1, (hit_rate(dlpm), hit_rate(vtc))
    prefilled = {name: sum(PROMPT - runs[name][0].cached.get(j.rid, 0) for j in JOBS) for name in runs}
    assert prefilled["dlpm"] < prefilled["vtc-prefix"], prefilled
    assert dlpm.steps < vtc.steps, (dlpm.steps, vtc.steps)


@pytest.mark.parametrize("name", ["dlpm", "vtc-prefix"])
def test_each_tenant_is_charged_its_requests_with_vllms_cached_tokens_at_w_cached(runs, name):
    run, sched = runs[name]
    expected: dict[str, float] = {}
    for job in JOBS:
        c = run.cached.get(job.rid, 0)
        expected[job.client] = expected.get(job.client, 0.0) + W_P * (PROMPT - c) + W_CACHED * c + W_Q * OUTPUT
    service = {t: v.service for t, v in sched.fairserve_accounts().items() if t in expected}
    assert service == pytest.approx(expected), (service, expected)
    assert any(run.cached.values())  # the cache served something: the w_cached price was in play


def test_dlpm_keeps_backlogged_tenants_within_its_bound(runs):
    run, sched = runs["dlpm"]
    assert sched.fairserve.policy.name == "dlpm600"
    # NOTE: 2·(Q + w_p·L_in + w_q·M) with M the pool's tokens (docs/architecture.md)
    bound = 2 * (QUANTUM + W_P * PROMPT + W_Q * POOL_TOKENS)
    gaps = []
    for service, queued in zip(run.service_at, run.queued_at, strict=True):
        backlogged = [service[t] for t, n in queued.items() if n]  # every pair both backlogged at this step
        if len(backlogged) > 1:
            gaps.append(max(backlogged) - min(backlogged))
    assert len(gaps) > 10 and max(gaps) <= bound, (max(gaps), bound)
