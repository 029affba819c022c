"""The named workloads with shared prefixes (workloads/prefixed.py): their structure, and what the prefix cache
finds in them."""

import pytest

from fairserve.sim import hit_rates, simulate
from fairserve.sim.prefix_cache import prompt_keys
from fairserve.workloads import ALL_WORKLOADS, PREFIX_WORKLOADS, WorkloadError, get_workload, prefix_workload

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", PREFIX_WORKLOADS)
def test_every_prefix_workload_is_named_sorted_and_its_prefixes_fit_its_prompts(name):
    assert name in ALL_WORKLOADS
    w = get_workload(name, duration_s=10)
    assert w.name == name and w.duration_s == 10 and len({a.client for a in w.arrivals}) == 8
    times = [a.arrival_s for a in w.arrivals]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 10
    for a in w.arrivals:
        assert sum(k for _, k in a.prefix) <= a.prompt_tokens and all(k >= 1 for _, k in a.prefix)


def test_who_shares_what():
    system = prefix_workload("system-prompts", duration_s=5)
    assert {a.client: a.prefix for a in system.arrivals} == {
        f"client-{i}": ((f"client-{i}/system", 1000),) for i in range(8)
    }
    assert {a.prompt_tokens for a in system.arrivals} == {1064}
    assert {a.prefix for a in prefix_workload("document", duration_s=5).arrivals} == {(("document", 1000),)}
    assert all(not a.prefix for a in prefix_workload("no-sharing", duration_s=5).arrivals)
    mix = prefix_workload("prefix-mix", duration_s=5).arrivals
    assert {a.client for a in mix if a.prefix} == {f"client-{i}" for i in (0, 2, 4, 6)}


def test_a_conversation_turn_extends_the_previous_turns_prompt():
    w = prefix_workload("conversations", clients=1, rate=1.0, duration_s=8, turns=4)
    turns = [a for a in w.arrivals if a.client == "client-0"]
    for prev, turn in zip(turns, turns[1:], strict=False):
        if len(turn.prefix) == 1:  # a new conversation
            assert turn.prompt_tokens == 1000 and turn.prefix[0][0] != prev.prefix[0][0]
            continue
        assert turn.prefix[:-1] == prev.prefix and turn.prompt_tokens == prev.prompt_tokens + 32 + 64
        # every full block of the previous prompt is a block of this one
        before, now = (
            prompt_keys(prev.prompt_tokens, 16, "p", prev.prefix),
            prompt_keys(turn.prompt_tokens, 16, "t", turn.prefix),
        )
        assert now[: len(before)] == before
        # ... and so is every full block of the previous answer: it continues as this turn's last segment
        answered = prompt_keys(prev.prompt_tokens + 32, 16, prev.continued_as, prev.prefix)
        assert prev.continued_as == turn.prefix[-1][0] and now[: len(answered)] == answered
    assert len(turns) == 8 and len({a.prefix[0][0] for a in turns}) == 2  # two conversations of 4 turns


def test_a_conversations_next_turn_finds_the_previous_answer_cached():
    w = prefix_workload("conversations", clients=1, rate=0.2, duration_s=20, turns=4)  # each turn done before the next
    r = simulate(w, "vtc", mode="paged", prefix_cache=True, drain=True)
    # turn k's KV holds its prompt (+2 template tokens) and 31 of its 32 output tokens: every full block of it is
    # found by turn k + 1 (1,033 tokens -> 64 blocks, 1,129 -> 70, 1,225 -> 76), the answer's blocks included
    assert r.cached_tokens == [0, 1024, 1120, 1216]


def test_the_cache_finds_what_the_workloads_share():
    def rates(name):
        r = simulate(get_workload(name, duration_s=10), "vtc", mode="paged", prefix_cache=True, kv_tokens=40_000)
        return hit_rates(r.records, r.cached_tokens)

    assert all(h > 0.8 for h in rates("document").values())  # one document: all but the very first request hit
    assert all(h == 0 for h in rates("no-sharing").values())
    mix = rates("prefix-mix")
    assert all((mix[f"client-{i}"] > 0.8) == (i % 2 == 0) for i in range(8))


def test_bad_sizes_are_one_clear_error():
    with pytest.raises(WorkloadError, match="sizes must be >= 1"):
        prefix_workload("system-prompts", clients=0)
    with pytest.raises(WorkloadError, match="unknown workload"):
        prefix_workload("nope")
    with pytest.raises(WorkloadError, match="duration_s"):
        get_workload("document", duration_s=-1)
