"""The policy registry: a new policy is one class and one `register(...)`, and every driver lists and builds it."""

from __future__ import annotations

from collections import deque

import pytest

from fairserve.core import (
    Capabilities,
    Ledger,
    Policy,
    Request,
    RequestState,
    check_policy,
    describe,
    make_policy,
    policy_names,
    register,
)
from fairserve.core.cost import make_cost
from fairserve.core.registry import split_options, unregister

pytestmark = pytest.mark.unit


class LIFO(Policy):
    """Newest first: the smallest policy there is."""

    name = "lifo"
    capabilities = Capabilities()

    def __init__(self, cost=None) -> None:
        super().__init__(cost)
        self._stack: deque[Request] = deque()

    def enqueue(self, req: Request, front: bool) -> None:
        self._stack.append(req)

    def peek(self) -> Request | None:
        while self._stack and self._stack[-1].state is not RequestState.QUEUED:
            self._stack.pop()
        return self._stack[-1] if self._stack else None

    def dequeue(self, req: Request) -> None:
        self._stack.pop()

    def remove(self, req: Request) -> None:
        pass  # skipped by peek() once its state changes


@pytest.fixture
def lifo():
    register("lifo", LIFO, "newest first")
    yield
    unregister("lifo")


def test_a_registered_policy_is_listed_and_built_by_every_driver(lifo, monkeypatch):
    assert "lifo" in policy_names() and "lifo" in describe() and "lifo" in describe(engine=True)
    led = Ledger(make_policy("lifo"))
    for i in range(3):
        led.arrive(i, "a", 10)
    assert [led.pop().id for _ in range(3)] == [2, 1, 0]

    from fairserve.cli import build_parser

    helps = {}
    parser = build_parser()
    for command in ("simulate", "gateway", "serve", "emulate"):
        sub = parser._subparsers._group_actions[0].choices[command]  # noqa: SLF001
        helps[command] = sub.format_help()
    assert all("lifo" in " ".join(text.split()) for text in helps.values()), helps

    from fairserve.sim import simulate
    from fairserve.workloads import get_workload

    result = simulate(get_workload("overload", duration_s=20), "lifo")
    assert result.ledger.policy.name == "lifo" and any(r.status == "finished" for r in result.records)

    from fairserve.engines.vllm_scheduler import VTCConfig, VTCRequestQueue
    from fairserve.gateway import build_config

    monkeypatch.setenv("FAIRSERVE_POLICY", "lifo")
    assert VTCRequestQueue.from_config(VTCConfig.from_env()).policy.name == "lifo"
    tenants = [{"name": "a", "api_keys": ["k"]}]
    cfg = build_config({"backends": [{"url": "http://127.0.0.1:9"}], "tenants": tenants, "policy": "lifo"})
    assert cfg.policy == "lifo"


def test_unknown_and_duplicate_names_are_refused(lifo):
    with pytest.raises(ValueError, match="registered already"):
        register("lifo", LIFO, "again")
    with pytest.raises(ValueError, match="register it with a `build`"):
        register("lifo2", LIFO, "takes an argument", argument="N")
    unregister("lifo")
    with pytest.raises(ValueError, match="unknown policy 'lifo'"):
        check_policy("lifo")


def test_engines_list_only_policies_that_never_reject():
    assert "rpm" in describe() and "rpm" not in describe(engine=True)
    entry, limit = check_policy("rpm:7")
    assert entry.capabilities.rejects_at_arrival and limit == 7


def test_a_policy_with_an_argument_gets_it_parsed_with_the_cost_and_seed():
    seen = {}

    def build(arg, cost, seed):
        seen.update(arg=arg, cost=cost, seed=seed)
        return LIFO(cost=cost)

    entry = register("lifo-n", LIFO, "newest first, with a number", argument="N", build=build)
    try:
        assert entry.summary == "newest first, with a number" and entry.usage == "lifo-n[:N]"
        assert describe().split(", ")[-1] == "lifo-n[:N]"  # one list, comma-separated
        policy = make_policy("lifo-n:7", w_p=0.5, w_q=3, seed=11)
        assert isinstance(policy, LIFO) and seen["arg"] == "7" and seen["seed"] == 11  # no parse: the text
        assert policy.cost.prompt(10) == 5 and policy.cost.output(10, 0, 1) == 3
        with pytest.raises(ValueError, match=r"policy 'lifo-n' needs an argument: lifo-n\[:N\]"):
            check_policy("lifo-n")
        assert make_policy("vtc-predict:oracle±10", seed=3).predictor.name == "oracle±10%"
        register("lifo-d", LIFO, "with a default", argument="N", default="5", parse=int, build=build)
        make_policy("lifo-d")
        assert seen["arg"] == 5  # the default, parsed
        make_policy("lifo-d:8")
        assert seen["arg"] == 8
    finally:
        unregister("lifo-n")
        unregister("lifo-d")


def test_engine_options_are_parsed_after_the_argument_and_refused_with_one_line():
    spec = "vtc-predict:oracle:preempt=500:preempt-max=1:running-cap=1"  # the smallest values allowed
    assert split_options(spec) == ("vtc-predict:oracle", {"preempt": 500.0, "preempt-max": 1, "running-cap": 1})
    assert split_options("vtc:preempt=0") == ("vtc", {"preempt": 0.0})
    for bad, message in [
        ("vtc:preempt=5=5", "engine option 'preempt' in 'vtc:preempt=5=5': '5=5' is not float"),
        (
            "vtc:slack=3",
            "unknown engine option 'slack' in 'vtc:slack=3'; choose from: preempt, preempt-max, running-cap",
        ),
        ("vtc:preempt=-1", "engine option 'preempt' in 'vtc:preempt=-1' must be >= 0"),
        ("vtc:preempt-max=0", "engine option 'preempt-max' in 'vtc:preempt-max=0' must be >= 1"),
        ("vtc:preempt=nan", "must be >= 0"),
    ]:
        with pytest.raises(ValueError) as e:
            split_options(bad)
        assert message in str(e.value), (bad, str(e.value))
    with pytest.raises(ValueError, match=r"engine options \(preempt, running-cap\) apply to the engines that preempt"):
        check_policy("vtc:preempt=5:running-cap=9")
    assert check_policy("vtc:preempt=5:running-cap=9", engine_options=True)[0].name == "vtc"


def test_a_bad_argument_is_named_and_every_policy_gets_its_cost():
    with pytest.raises(ValueError, match=r"^policy 'fcfs' takes no argument \(got 'fcfs:3'\)$"):
        check_policy("fcfs:3")
    with pytest.raises(ValueError, match=r"^bad argument in policy 'rpm:many': 'many' is not a number$"):
        check_policy("rpm:many")
    for name in ("fcfs", "vtc"):
        assert make_policy(name, w_p=0.5, w_q=3).cost.prompt(10) == 5
        assert make_policy(name, cost="profiled").cost.name == make_cost("profiled").name != "linear"
