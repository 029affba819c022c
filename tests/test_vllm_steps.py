"""The simulator's engine mode `vllm` (sim/vllm_steps.py): vLLM v1's step loop. Hand-computed schedules (chunks,
decodes before admissions, `max_num_seqs`, preemption and recompute, the two victim rules), its invariants on random
workloads, Theorem 4.4's bound under VTC with FCFS as the negative control, and its options. The step-by-step match
with vLLM itself is tests_vllm/test_vllm_mode.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.cli import main
from fairserve.core import Ledger, make_policy
from fairserve.metrics import summarize
from fairserve.sim import SimOptions, engine_config, simulate
from fairserve.sim.latency import ConstantLatency, LinearLatency
from fairserve.sim.requests import EngineConfig, SimRequest, too_large
from fairserve.sim.vllm_steps import VllmEngine, step_s
from fairserve.workloads import get_workload
from fairserve.workloads.base import Arrival

pytestmark = pytest.mark.unit

ONE_SECOND = ConstantLatency(prefill_s_fixed=1.0, decode_s=1.0)  # every step, of any kind, takes 1 s


class Recording(VllmEngine):
    """The engine, with what each step scheduled ({request id: tokens}), its victims and its invariants checked."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.schedules: list[dict[int, int]] = []
        self.victims: list[SimRequest] = []
        self.total_blocks = self.free_blocks

    def _schedule(self, now: float) -> list[tuple[SimRequest, int]]:
        out = super()._schedule(now)
        assert sum(n for _, n in out) <= self.budget_tokens and len(self.running) <= self.max_seqs
        assert 0 <= self.free_blocks and self.free_blocks + sum(self._held.values()) == self.total_blocks
        self.schedules.append({r.id: n for r, n in out})
        return out

    def _preempt(self, r: SimRequest) -> None:
        self.victims.append(r)
        super()._preempt(r)


def run(arrivals, policy="fcfs", latency=ONE_SECOND, **config) -> Recording:
    cfg = EngineConfig(mode="vllm", **({"kv_tokens": 1024, "block_tokens": 16} | config))
    engine = Recording(Ledger(make_policy(policy)), latency, cfg)
    engine.result = engine.run(arrivals)  # type: ignore[attr-defined]
    return engine


def test_a_step_costs_its_prefill_chunks_and_its_decodes_with_one_fixed_cost():
    lat = LinearLatency(
        "l", prefill_fixed_s=0.01, prefill_per_token_s=1e-4, decode_fixed_s=0.004, decode_per_seq_s=1e-3
    )
    assert step_s(lat, [], 3, 100) == lat.decode_step_s(3, 100)
    assert step_s(lat, [10, 20], 0, 0) == lat.prefill_s([10, 20])
    mixed = step_s(lat, [10, 20], 3, 100)
    assert mixed == pytest.approx(lat.prefill_s([10, 20]) + 3e-3)  # the decodes add their per-request cost only


def test_a_long_prompt_is_prefilled_in_chunks_of_the_budget_then_decoded():
    e = run([Arrival(0.0, "a", 80, 3)], batch_max_tokens=32)
    assert e.schedules == [{0: 32}, {0: 32}, {0: 16}, {0: 1}, {0: 1}]
    (rec,) = e.result.records
    assert (rec.admit_s, rec.first_token_s, rec.finish_s, rec.output_tokens) == (0.0, 3.0, 5.0, 3)
    assert e.result.prefills == 3 and e.result.decode_steps == 5
    # without chunked prefill the prompt goes in one step, where it fits one
    whole = run([Arrival(0.0, "a", 80, 3)], batch_max_tokens=128, chunked_prefill=False)
    assert whole.schedules == [{0: 80}, {0: 1}, {0: 1}]
    assert run([Arrival(0.0, "a", 80, 3)], batch_max_tokens=32, chunked_prefill=False).result.records[0].status == (
        "rejected"
    )


def test_running_requests_go_first_then_admissions_while_budget_and_max_num_seqs_last():
    two = [Arrival(0.0, "a", 20, 5), Arrival(0.0, "b", 20, 5)]
    e = run(two, batch_max_tokens=32)
    assert e.schedules[:3] == [{0: 20, 1: 12}, {0: 1, 1: 8}, {0: 1, 1: 1}]
    one_at_a_time = run(two, batch_max_tokens=32, running_max=1)
    assert one_at_a_time.schedules == [{0: 20}, *[{0: 1}] * 4, {1: 20}, *[{1: 1}] * 4]


def test_a_short_pool_preempts_the_newest_which_recomputes_and_is_charged_once():
    """10 blocks of 4 tokens; two requests that grow to 28 tokens each cannot both stay."""
    reqs = [Arrival(0.0, "a", 8, 20), Arrival(0.0, "b", 8, 20)]
    e = run(reqs, kv_tokens=40, block_tokens=4, batch_max_tokens=64)
    assert [v.id for v in e.victims] == [1] and e.result.preemptions == 1
    resumed = [s[1] for s in e.schedules if s.get(1, 0) > 1][1:]  # its prefills after the first
    assert resumed and resumed[0] > 8  # the prompt and the output it had
    assert [r.output_tokens for r in e.result.records] == [20, 20]
    assert {t: a.service for t, a in e.ledger.accounts.items()} == {"a": 48.0, "b": 48.0}  # 8 + 2·20, once


@pytest.mark.parametrize(("by_counter", "victim"), [(True, "h"), (False, "l")])
def test_the_victim_is_the_highest_counters_newest_or_vllms_newest(by_counter, victim):
    """A heavy tenant's two requests run; a light tenant's arrives after them, the newest: by counter (the plugin's
    default) the heavy tenant gives way, by vLLM's rule the light one."""
    reqs = [Arrival(0.0, "h", 8, 16), Arrival(0.0, "h", 8, 16), Arrival(1.0, "l", 4, 12)]
    e = run(reqs, "vtc", kv_tokens=48, block_tokens=4, batch_max_tokens=32, victim_by_counter=by_counter)
    assert e.victims and e.victims[0].tenant == victim
    assert all(r.status == "finished" for r in e.result.records)


@settings(max_examples=60, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(st.floats(0, 10), st.sampled_from("abc"), st.integers(1, 120), st.integers(1, 40)),
        min_size=1,
        max_size=10,
    ),
    block=st.sampled_from([4, 16]),
    kv=st.integers(160, 600),
    budget=st.integers(8, 128),
    seqs=st.integers(1, 4),
    chunked=st.booleans(),
    policy=st.sampled_from(["vtc", "fcfs"]),
)
def test_every_step_keeps_vllms_limits_and_every_request_finishes_charged_once(
    reqs, block, kv, budget, seqs, chunked, policy
):
    arrivals = [Arrival(t, c, p, o) for t, c, p, o in reqs]
    e = run(
        arrivals,
        policy,
        kv_tokens=kv,
        block_tokens=block,
        batch_max_tokens=budget,
        running_max=seqs,
        chunked_prefill=chunked,
    )
    expected: dict[str, float] = {}
    for rec in e.result.records:
        if too_large(e.config, rec.prompt_tokens, rec.max_tokens) is not None:
            assert rec.status == "rejected"
            continue
        assert rec.status == "finished" and rec.output_tokens == rec.max_tokens
        assert rec.arrival_s <= rec.admit_s < rec.first_token_s <= rec.finish_s
        expected[rec.client] = expected.get(rec.client, 0.0) + rec.prompt_tokens + 2 * rec.output_tokens
    assert e.free_blocks == e.total_blocks and not e.running
    assert {t: a.service for t, a in e.ledger.accounts.items() if t in expected} == expected


def test_vtc_keeps_backlogged_tenants_within_the_bound_and_fcfs_does_not():
    """Theorem 4.4 on the vLLM mode: two backlogged tenants differ by at most 2·max(w_p·L_in, w_q·M)."""
    wl = get_workload("overload")
    bound = 2 * max(max(a.prompt_tokens for a in wl.arrivals), 2 * 10_000)  # M: the pool, 10,000 tokens
    diffs = {}
    for policy in ("vtc", "fcfs"):
        result = simulate(wl, SimOptions(policy=policy, mode="vllm", kv_tokens=10_000))
        diffs[policy] = summarize(result.records, wl.duration_s).max_backlogged_diff
    assert diffs["vtc"] <= bound < diffs["fcfs"], diffs


def test_a_profile_file_brings_its_block_size_and_chunking(tmp_path):
    from test_engine_profile import profile

    path = tmp_path / "engine.json"
    p = profile(block_tokens=32, max_num_seqs=8, max_batched_tokens=1024)
    data = p.to_dict() | {"engine": {"kind": "vllm", "settings": {"chunked_prefill": False}}}
    path.write_text(json.dumps(data))
    cfg = engine_config(str(path), mode="vllm")
    assert (cfg.block_tokens, cfg.running_max, cfg.prefill_tokens, cfg.chunked_prefill) == (32, 8, 1024, False)
    wl = get_workload("overload")
    result = simulate(wl, SimOptions(latency=str(path), mode="vllm", until_s=5.0))
    assert result.config == cfg and result.decode_steps > 0


def test_what_the_vllm_mode_does_not_run_is_one_clear_error(capsys):
    with pytest.raises(ValueError, match="engine mode 'vllm' runs vLLM's own preemption"):
        EngineConfig(mode="vllm").with_options({"preempt": 500.0})
    with pytest.raises(ValueError, match="victim=counter compares tenants' counters"):
        VllmEngine(Ledger(make_policy("fcfs")), ONE_SECOND, EngineConfig(mode="vllm", victim_by_counter=True))
    with pytest.raises(ValueError, match="runs one engine"):
        SimOptions(mode="vllm", engines=2).check()
    with pytest.raises(ValueError, match="needs --engine-mode paged"):
        SimOptions(mode="vllm", prefix_cache=True).check()
    code = main(["emulate", "--engine-mode", "vllm", "--port", "0"])
    assert code == 2 and "engine mode must be one of reserve, paged" in capsys.readouterr().err
