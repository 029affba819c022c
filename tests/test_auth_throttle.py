"""The failed-authentication throttle on its own clock: per address, per key across addresses, its window, and the
bound on what it remembers."""

from __future__ import annotations

import pytest

from fairserve.tenancy import AuthThrottle

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_throttled_after_the_limit_for_the_rest_of_its_window():
    clock = Clock()
    t = AuthThrottle(3, 60.0, clock=clock)
    for i in range(3):
        assert t.blocked("10.0.0.1", f"wrong-{i}") == 0.0
        t.failed("10.0.0.1", f"wrong-{i}")
        clock.now += 10
    assert t.blocked("10.0.0.1", "wrong-9") == 30.0  # the window began at the first failure, 30 s ago
    assert t.blocked("10.0.0.1", None) == 30.0  # no key at all: by its address
    assert t.blocked("10.0.0.2", "wrong-9") == 0.0  # its neighbours' wrong keys are not its
    clock.now += 30
    assert t.blocked("10.0.0.1", "wrong-9") == 0.0 and "10.0.0.1" not in t.addresses.entries


def test_one_wrong_key_is_throttled_from_every_address():
    clock = Clock()
    t = AuthThrottle(3, 60.0, clock=clock)
    for i in range(3):
        t.failed(f"10.0.0.{i}", "stale-key")  # three pods with the same stale key: no address failed twice
    assert all(t.blocked(f"10.0.0.{i}", "other") == 0.0 for i in range(3))
    assert t.blocked("10.9.9.9", "stale-key") == 60.0  # a new address with that key
    assert t.blocked("10.9.9.9", "stale-kez") == 0.0  # one character off: another key
    clock.now += 60
    assert t.blocked("10.9.9.9", "stale-key") == 0.0


def test_the_longer_of_the_two_waits_is_given():
    clock = Clock()
    t = AuthThrottle(2, 60.0, clock=clock)
    t.failed("a", "k1")
    t.failed("a", "k2")  # address a: throttled until 1060
    clock.now += 30
    t.failed("b", "k3")
    t.failed("c", "k3")  # key k3: throttled until 1090
    assert t.blocked("a", None) == 30.0 and t.blocked("d", "k3") == 60.0 and t.blocked("a", "k3") == 60.0


def test_limit_zero_is_off():
    t = AuthThrottle(0, 60.0, clock=Clock())
    for _ in range(100):
        t.failed("10.0.0.1", "guess")
    assert t.blocked("10.0.0.1", "guess") == 0.0 and not t.addresses.entries and not t.keys.entries


def test_memory_is_bounded_and_the_oldest_failure_is_forgotten_first():
    clock = Clock()
    t = AuthThrottle(2, 60.0, max_addresses=50, max_keys=20, clock=clock)
    t.failed("10.0.0.1", "stale-key")
    t.failed("10.0.0.2", "stale-key")  # the stale key is throttled
    for i in range(10_000):  # a scan: a new address and a new key each time
        clock.now += 0.001
        t.failed(f"192.0.2.{i}", f"guess-{i}")
        if i % 10 == 0:
            t.failed("10.0.0.3", "stale-key")  # still failing: kept
    assert len(t.addresses.entries) == 50 and len(t.keys.entries) == 20
    assert t.blocked("10.0.0.4", "stale-key") > 0  # it failed lately, so it is remembered
    assert t.blocked("10.0.0.1", None) == 0.0  # forgotten: the oldest failures go first
    assert t.blocked("10.0.0.4", "guess-0") == 0.0 and "192.0.2.9999" in t.addresses.entries


def test_keys_are_remembered_by_a_digest_of_this_process_never_in_clear():
    t, other = AuthThrottle(1, 60.0, clock=Clock()), AuthThrottle(1, 60.0, clock=Clock())
    t.failed("a", "sk-secret-typo")
    other.failed("a", "sk-secret-typo")
    assert "sk-secret" not in repr(t.keys.entries) and t.keys.entries.keys() != other.keys.entries.keys()
