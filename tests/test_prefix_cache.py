"""The paged engine's prefix cache (sim/prefix_cache.py): sharing, reference counts, LRU eviction, conservation."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.sim.prefix_cache import PrefixCache, prompt_keys

pytestmark = pytest.mark.unit

B = 16


def keys(prompt, own, prefix=None, shared=0):
    return prompt_keys(prompt, B, own, ((prefix, shared),) if prefix else ())


def test_keys_name_the_shared_prefix_then_the_requests_own_blocks():
    assert keys(70, "r1", "sys", 40) == [("sys", 16), ("sys", 32), ("r1", 48), ("r1", 64)]
    assert keys(70, "r1") == [("r1", 16 * i) for i in range(1, 5)]  # 70 tokens: 4 full blocks and a partial one
    assert keys(20, "r1", "sys", 500) == [("sys", 16)]  # a prefix longer than the prompt: the prompt is the prefix
    assert keys(63, "r", "sys", 31) == [("sys", 16), ("r", 32), ("r", 48)]  # a block one token short is its own
    # chained segments (Mooncake's hash ids): a block is named by the segment that holds its last token
    assert prompt_keys(64, B, "r", (("a", 20), ("b", 20))) == [("a", 16), ("b", 32), ("r", 48), ("r", 64)]
    assert prompt_keys(64, B, "s", (("a", 20), ("c", 44))) == [("a", 16), ("c", 32), ("c", 48), ("c", 64)]


def test_a_repeated_prompt_hits_all_but_the_block_of_its_last_token():
    cache = PrefixCache(64, B)
    first = cache.admit(keys(100, "a", "doc", 100), 100, extra_tokens=1)
    assert first.cached_tokens == 0 and len(first.keys) == 6 and first.own == 1  # 6 full blocks + the 7th, own
    cache.release(first)
    again = cache.admit(keys(100, "b", "doc", 100), 100, extra_tokens=1)
    assert again.cached_tokens == 96  # 6 blocks; the 7th holds the last prompt token (always computed)
    assert cache.admit(keys(97, "c", "doc", 97), 97).cached_tokens == 96  # its last token starts a 7th block
    assert (cache.hit_tokens, cache.queried_tokens) == (192, 297)
    exact = PrefixCache(64, B)
    held = exact.admit(keys(96, "a", "doc", 96), 96)
    second = exact.admit(keys(96, "b", "doc", 96), 96)
    assert second.cached_tokens == 80 and second.own == 1  # 96 = 6 blocks: the 6th is recomputed, b's own copy
    assert exact.refs[("doc", 96)] == 1
    exact.release(held)
    exact.check()


def test_bad_sizes_are_refused():
    for blocks, tokens in ((0, 16), (8, 0)):
        with pytest.raises(ValueError, match="needs >= 1 block"):
            PrefixCache(blocks, tokens)
    assert PrefixCache(1, 1).available == 1


def test_requests_running_together_share_their_prefix_blocks():
    cache = PrefixCache(20, B)
    a = cache.admit(keys(64, "a", "sys", 48), 64)
    b = cache.admit(keys(64, "b", "sys", 48), 64)
    assert b.cached_tokens == 48 and cache.refs[("sys", 16)] == 2
    assert cache.free == 20 - 4 - 1  # a: 4 blocks; b: its own 4th block only
    cache.release(a)
    assert cache.refs[("sys", 48)] == 1 and ("a", 64) in cache.unused
    cache.check()


def test_eviction_takes_the_least_recently_used_and_a_prefix_tail_first():
    cache = PrefixCache(6, B)
    cache.release(cache.admit(keys(48, "x", "p", 48), 48, extra_tokens=1))  # p0 p1 p2 cached, 1 own freed
    cache.release(cache.admit(keys(32, "y", "q", 32), 32, extra_tokens=1))  # q0 q1 cached
    assert list(cache.unused) == [("p", 48), ("p", 32), ("p", 16), ("q", 32), ("q", 16)] and cache.free == 1
    held = cache.admit(keys(48, "z"), 48)  # 3 blocks: the free one, then p2 and p1
    assert held is not None and list(cache.unused) == [("p", 16), ("q", 32), ("q", 16)]
    assert cache.admit(keys(40, "w", "p", 40), 40).cached_tokens == 16  # p0 survived: still a prefix
    cache.check()


def test_a_request_that_does_not_fit_changes_nothing():
    cache = PrefixCache(4, B)
    held = cache.admit(keys(48, "a", "s", 48), 48)
    before = (cache.free, list(cache.unused), dict(cache.refs), cache.own, cache.hit_tokens)
    assert cache.admit(keys(64, "b", "s", 64), 64, extra_tokens=1) is None  # 5 blocks, 3 of them shared: 2 > 1 free
    assert (cache.free, list(cache.unused), dict(cache.refs), cache.own, cache.hit_tokens) == before
    assert cache.grow(held) and not cache.grow(held)
    cache.check()


def test_the_cached_prefix_a_request_reuses_is_no_room_for_its_other_blocks():
    cache = PrefixCache(4, B)
    cache.release(cache.admit(keys(48, "a", "s", 48), 48, extra_tokens=1))  # s0 s1 s2 cached, 1 free
    assert cache.admit(keys(64, "b", "s", 48), 64, extra_tokens=1) is None  # 3 hits + 2 blocks > 4
    held = cache.admit(keys(64, "c", "s", 48), 64)  # 3 hits + 1 block
    assert held.cached_tokens == 48 and cache.free == 0 and not cache.unused
    cache.release(held)
    assert held.keys == [] and held.own == 0
    cache.check()


requests = st.tuples(st.sampled_from([None, "s1", "s2"]), st.integers(0, 120), st.integers(1, 120))
ops = st.lists(st.tuples(st.sampled_from(["admit", "grow", "release"]), requests, st.integers(0, 99)), max_size=80)


@settings(max_examples=150, deadline=None)
@given(st.integers(4, 40), ops)
def test_referenced_blocks_are_never_evicted_and_every_block_is_in_one_place(num_blocks, steps):
    cache, running = PrefixCache(num_blocks, B), []
    for n, (op, (prefix, shared, prompt), pick) in enumerate(steps):
        if op == "admit":
            ks = keys(prompt, n, prefix, shared)
            expect = cache.cached_prefix(ks, prompt)
            held = cache.admit(ks, prompt, extra_tokens=1)
            if held is not None:
                assert held.cached_tokens == expect * B and len(held.keys) + held.own == cache.blocks_for(prompt + 1)
                running.append(held)
        elif running and op == "grow":
            cache.grow(running[pick % len(running)])
        elif running:
            cache.release(running.pop(pick % len(running)))
        cache.check()
        held_refs = Counter(k for h in running for k in h.keys)
        assert held_refs == Counter(cache.refs)  # a referenced block is held by exactly its running requests
        assert cache.own == sum(h.own for h in running)
    for held in running:
        cache.release(held)
    assert not cache.refs and cache.own == 0 and cache.available == num_blocks


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 400),  # the prompt
    st.sampled_from([1, 7, 16, 32]),  # block size
    st.lists(st.tuples(st.sampled_from(["s1", "s2", "own"]), st.integers(1, 200)), max_size=3),  # its segments
    st.integers(0, 30),  # spare blocks beyond what it needs
    ops,
)
def test_a_repeated_prompt_that_fits_hits_fully_whatever_ran_in_between(prompt, size, segments, spare, others):
    """Every block before its last token, however other requests used the pool meanwhile: while the first copy runs
    (its blocks referenced), and right after it ended (its blocks the most recently used)."""
    prefix = tuple((name, k) for name, k in segments if name != "own")
    need = -(-(prompt + 1) // size)
    cache = PrefixCache(2 * need + spare, size)
    ks = prompt_keys(prompt, size, "same", prefix)  # NOTE: the same own name: the same tokens after the prefix
    first = cache.admit(ks, prompt, extra_tokens=1)
    assert first is not None
    full = (prompt - 1) // size * size
    running = []
    for n, (op, (pre, shared, length), pick) in enumerate(others):  # other requests come and go (never the first)
        if op == "admit":
            held = cache.admit(prompt_keys(length, size, n, ((pre, shared),) if pre else ()), length, 1)
            running += [held] if held is not None else []
        elif running:
            cache.release(running.pop(pick % len(running)))
        cache.check()
    for held in running:
        cache.release(held)
    again = cache.admit(prompt_keys(prompt, size, "same", prefix), prompt, extra_tokens=1)
    assert again is not None and again.cached_tokens == full
    cache.release(again)
    cache.release(first)
    last = cache.admit(prompt_keys(prompt, size, "same", prefix), prompt, extra_tokens=1)
    assert last is not None and last.cached_tokens == full
    cache.check()
