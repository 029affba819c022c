"""Each LoRA adapter a tenant, as in the paper's S-LoRA setting: two real adapters on the test model, one LoRA slot
(`max_loras=1`), both adapters backlogged. vLLM skips a request whose adapter gets no slot; fairserve's LoRA-slot
rule (engines/vllm_lora.py) keeps the lowest-counter adapter from starving while the other keeps the slot."""

from __future__ import annotations

import statistics

import pytest
from engine import W_Q, Job, drive, scheduler_of

HEAVY, LIGHT = 12, 6
K, LONGEST, BATCH, PROMPT = 4, 14, 4, 32  # FAIRSERVE_LORA_WAIT_STEPS of the "lora" engine; the jobs below
# While both adapters wait, the rule keeps their service within what the slot holder gets in K steps plus the drain
# of its longest request, with a batch of prompts admitted meanwhile: (4 + 14) x 4 x w_q + 4 x 32 = 272
GAP_BOUND = (K + LONGEST) * BATCH * W_Q + BATCH * PROMPT


def adapter_jobs(tag: str) -> list[Job]:
    """A heavy adapter's 12 requests of uneven lengths, 6 to 14 tokens (one of them is always running: it would keep
    the slot), and a light adapter's 6, the first with the heavy adapter's first prompt. No tenant is named: the
    adapter is the tenant."""
    heavy = [Job(f"{tag}h-{i}", None, PROMPT, 6 + (5 * i) % 9, lora=f"{tag}heavy") for i in range(HEAVY)]
    light = [Job(f"{tag}l-{i}", None, PROMPT, 10, lora=f"{tag}light", seed=0 if i == 0 else None) for i in range(LIGHT)]
    return heavy + light


def loras(tag: str, adapters, first_id: int) -> dict:
    from vllm.lora.request import LoRARequest

    return {
        f"{tag}heavy": LoRARequest(f"{tag}heavy", first_id, str(adapters["a"])),
        f"{tag}light": LoRARequest(f"{tag}light", first_id + 1, str(adapters["b"])),
    }


def gaps_while_both_backlogged(run, tag: str) -> list[float]:
    """Heavy's service minus light's, after each step at which both adapters had requests waiting."""
    both = [i for i, q in enumerate(run.queued_at) if q.get(f"{tag}heavy") and q.get(f"{tag}light")]
    return [run.service_at[i][f"{tag}heavy"] - run.service_at[i].get(f"{tag}light", 0.0) for i in both]


@pytest.fixture(scope="module")
def runs(engines, adapters):
    """The same requests three times: under fairserve with the rule and without it, and under vLLM's default."""
    llm = engines.get("lora")
    slots = scheduler_of(llm).fairserve_slots
    with_rule = drive(llm, adapter_jobs("v"), loras=loras("v", adapters, 1))
    held = slots.held_steps
    wait, slots.wait_steps = slots.wait_steps, None  # the rule off, as FAIRSERVE_LORA_WAIT_STEPS=off
    try:
        without = drive(llm, adapter_jobs("n"), loras=loras("n", adapters, 3))
    finally:
        slots.wait_steps = wait
    default = drive(engines.get("lora-default"), adapter_jobs("d"), loras=loras("d", adapters, 1))
    return with_rule, without, default, held


def test_both_adapters_are_served_in_turns_with_vtcs_shares(runs):
    """The heavy/light check per adapter: the light adapter's median request finishes before most of the heavy
    adapter's backlog; while both have requests waiting, their service stays within GAP_BOUND."""
    run, _, _, held = runs
    jobs = adapter_jobs("v")
    light = statistics.median(run.finished_at[j.rid] for j in jobs if j.lora == "vlight")
    heavy = [run.finished_at[j.rid] for j in jobs if j.lora == "vheavy"]
    assert held > 0  # the rule held the heavy adapter back
    assert sum(step < light for step in heavy) < len(heavy) / 2, (light, sorted(heavy))
    gaps = gaps_while_both_backlogged(run, "v")
    assert max(abs(g) for g in gaps) <= GAP_BOUND, gaps


def test_without_the_rule_the_lowest_counter_adapter_starves(runs):
    """The same requests with FAIRSERVE_LORA_WAIT_STEPS=off: the light adapter has the lower counter from the second
    admission on, but the heavy adapter keeps the one slot until its backlog is gone."""
    _, run, _, _ = runs
    jobs = adapter_jobs("n")
    last_heavy = max(run.admitted.index(j.rid) for j in jobs if j.lora == "nheavy")
    first_light = min(run.admitted.index(j.rid) for j in jobs if j.lora == "nlight")
    assert last_heavy < first_light, run.admitted
    assert max(gaps_while_both_backlogged(run, "n")) > GAP_BOUND  # and it grows with the heavy backlog


def test_adapter_outputs_are_the_default_schedulers(runs):
    """Greedy tokens of every adapter request: the same under fairserve (with and without the rule, in different
    batches) as under vLLM's default scheduler."""
    with_rule, without, default, _ = runs
    for job in adapter_jobs("d"):
        same = job.rid[1:]
        assert with_rule.tokens["v" + same] == default.tokens[job.rid] == without.tokens["n" + same], job
    assert default.tokens["dl-0"][:6] != default.tokens["dh-0"]  # the same prompt: each adapter is applied
