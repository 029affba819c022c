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
from fairserve.core.registry import unregister


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
