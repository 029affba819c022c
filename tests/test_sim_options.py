"""One options type (`SimOptions`) for `simulate()`, `fairserve simulate`, `sweep` and `reproduce`, and one policy
spec parsed once: every engine option reaches every command, and a bad one gets its own reason."""

import argparse
from dataclasses import replace

import pytest

from fairserve.cli import build_parser, main
from fairserve.core import registry
from fairserve.core.registry import PolicySpec, parse_spec
from fairserve.sim import SimOptions, simulate
from fairserve.sweep import from_mapping
from fairserve.sweep.cli import values_from
from fairserve.sweep.work import Task, execute, own_digest
from fairserve.workloads import get_workload

pytestmark = pytest.mark.unit


def test_a_spec_is_parsed_once_for_a_run(monkeypatch):
    calls = []
    real = registry.split_options
    monkeypatch.setattr(registry, "split_options", lambda spec: calls.append(spec) or real(spec))
    result = simulate(get_workload("overload", duration_s=20), SimOptions(policy="vtc:preempt=500"))
    assert calls == ["vtc:preempt=500"]
    assert result.config.preempt_delta == 500.0 and result.ledger.policy.name == "vtc"
    spec = parse_spec("dlpm:64:running-cap=900", engine_options=True, prefix_cache=True)
    assert isinstance(spec, PolicySpec)
    assert (spec.policy, spec.argument, spec.options) == ("dlpm:64", 64.0, {"running-cap": 900})


def test_the_options_object_and_the_old_keywords_give_the_same_run():
    w = get_workload("overload", duration_s=40)
    old = simulate(w, "vtc:preempt=200", kv_tokens=6000, mode="paged", w_q=3.0, drain=True)
    new = simulate(w, SimOptions(policy="vtc:preempt=200", kv_tokens=6000, mode="paged", w_q=3.0, drain=True))
    assert old.records == new.records and old.fair_preemptions == new.fair_preemptions > 0
    with pytest.raises(TypeError, match="unexpected keyword arguments: mod"):
        simulate(w, "vtc", mod="paged")
    with pytest.raises(TypeError, match="not both"):
        simulate(w, SimOptions(), drain=True)


@pytest.mark.parametrize(
    "options, message",
    [
        (SimOptions(policy="fcfs:preempt=500"), "preempt= compares tenants' counters: policy 'fcfs' keeps none"),
        (SimOptions(policy="lpm"), "needs the prefix cache: --engine-mode paged --prefix-cache"),
        (SimOptions(prefix_cache=True), "--prefix-cache needs --engine-mode paged"),
        (SimOptions(policy="vtc:running-cap=9", mode="paged", prefix_cache=True), "not combine with running-cap="),
        (SimOptions(latency="tpu-9000"), "unknown latency model"),
        (SimOptions(cost="profiled", w_cached=0.1), "w_cached"),
    ],
)
def test_each_bad_option_gets_its_own_reason(options, message):
    with pytest.raises(ValueError, match=message):
        options.check()


def sweep_args(*flags: str) -> argparse.Namespace:
    return build_parser("sweep").parse_args(["sweep", "--workload", "overload", "--duration", "30", *flags])


def test_the_sweep_takes_engine_options_and_the_prefix_cache():
    config = from_mapping(values_from(sweep_args("--policy", "vtc,vtc:preempt=500")))
    points = config.points()
    assert [p.sim_options().policy for p in points] == ["vtc", "vtc:preempt=500"]
    diffs = [execute(Task(p, None, own_digest()))["metrics"]["max_backlogged_diff"] for p in points]
    assert diffs[1] < 0.5 * diffs[0]  # preemption at a counter gap of 500 holds the difference down
    cached = sweep_args("--policy", "vtc,dlpm", "--engine-mode", "paged", "--prefix-cache", "--block-tokens", "32")
    config = from_mapping(values_from(cached))
    run = config.points()[1].sim_options()
    assert (run.policy, run.mode, run.prefix_cache, run.block_tokens) == ("dlpm", "paged", True, 32)
    assert config.points()[1].spec()["block_tokens"] == 32 and "block_tokens" not in points[0].spec()
    with pytest.raises(ValueError, match="needs the prefix cache"):
        from_mapping(values_from(sweep_args("--policy", "dlpm", "--engine-mode", "paged")))
    with pytest.raises(ValueError, match="prefix_cache: expected true or false"):
        from_mapping({"policies": ["vtc"], "workloads": ["overload"], "prefix_cache": "yes"})


def test_simulate_names_the_real_reason_for_a_bad_engine_option(capsys):
    code = main(["simulate", "--workload", "overload", "--duration", "20", "--policy", "fcfs:preempt=500"])
    err = capsys.readouterr().err
    assert code == 2 and "policy 'fcfs' keeps none; use vtc" in err and "engines that preempt" not in err


def test_the_vllm_plugins_victim_rule_is_refused_by_the_other_modes_not_ignored(capsys):
    code = main(["simulate", "--workload", "overload", "--duration", "20", "--policy", "vtc:victim=counter"])
    err = capsys.readouterr().err
    assert code == 2 and "applies to the vLLM plugin (docs/vllm.md) and engine mode 'vllm'" in err
    args = ["simulate", "--workload", "overload", "--duration", "20", "--engine-mode", "vllm"]
    assert main([*args, "--policy", "vtc:victim=vllm"]) == 0
    capsys.readouterr()
    assert main([*args, "--policy", "vtc:preempt=500"]) == 2
    assert "engine mode 'vllm' runs vLLM's own preemption" in capsys.readouterr().err


def test_a_reproduce_run_is_a_simulate_run_with_the_same_options():
    from fairserve.reproduce.runs import RunSpec

    spec = RunSpec("overload", "vtc:preempt=1000", mode="paged", kv_tokens=8000)
    same = replace(SimOptions(), policy="vtc:preempt=1000", mode="paged", kv_tokens=8000, cost="linear")
    assert spec.options() == same
