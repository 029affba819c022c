"""vLLM's prefix cache in the plugin, over fakes: `lpm` and `dlpm` order by vLLM's own lookup
(`kv_cache_manager.get_computed_blocks`, remembered while the pool is unchanged), and `FAIRSERVE_W_CACHED` prices
the prompt tokens vLLM served from its cache at admission (`prefill_stats.num_cached_tokens`). The real engine:
tests_vllm/test_dlpm.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.vllm_fakes import FakeRequest, make_queue
from test_vllm_scheduler import FakeAsyncScheduler, FakeScheduler, config

from fairserve.engines.vllm_config import VTCConfig
from fairserve.engines.vllm_prefix import PrefixProbe, cached_at_admission, check_prefix_caching
from fairserve.engines.vllm_scheduler import scheduler_classes

pytestmark = pytest.mark.unit


class FakeKVCacheManager:
    """vLLM's KV cache manager as the plugin reads it: `cached[request id]` tokens hit, a count of free blocks."""

    def __init__(self, cached: dict[str, int] | None = None, enable_caching: bool = True) -> None:
        self.cached = dict(cached or {})
        self.enable_caching = enable_caching
        self.free = 100
        self.block_pool = SimpleNamespace(get_num_free_blocks=lambda: self.free)
        self.asked: list[str] = []

    def get_computed_blocks(self, request) -> tuple[object, int, int]:
        self.asked.append(request.request_id)
        return object(), self.cached.get(request.request_id, 0), 0


def cached_request(rid: str, client: str, prompt: int, cached: int | None) -> FakeRequest:
    r = FakeRequest(rid, client, prompt=prompt)
    if cached is not None:
        r.prefill_stats = SimpleNamespace(num_cached_tokens=cached)  # as vLLM sets it before it pops the request
    return r


# ---- charges -------------------------------------------------------------------------------------------------------
def test_w_cached_prices_the_tokens_vllm_served_from_its_cache_at_admission():
    q = make_queue(policy="vtc", w_cached=0.25)
    q.add_request(cached_request("a", "alice", prompt=100, cached=64))
    q.pop_request()
    assert q.ledger.service["alice"] == 100 - 64 + 0.25 * 64  # w_p·(x - c) + w_cached·c


def test_without_w_cached_a_cached_token_costs_w_p_the_papers_charge():
    q = make_queue(policy="vtc")
    q.add_request(cached_request("a", "alice", prompt=100, cached=64))
    q.pop_request()
    assert q.ledger.service["alice"] == 100


def test_a_skipped_request_is_refunded_and_priced_again_at_its_next_pop():
    q = make_queue(policy="vtc", w_cached=0.0)
    r = cached_request("a", "alice", prompt=100, cached=32)
    q.add_request(r)
    q.pop_request()
    assert q.ledger.service["alice"] == 68
    q.prepend_request(r)  # vLLM's skip: never scheduled
    q.end_pass()
    assert q.ledger.service["alice"] == 0
    r.prefill_stats.num_cached_tokens = 96  # more is cached by the next pass
    q.pop_request()
    assert q.ledger.service["alice"] == 4


def test_cached_at_admission_reads_only_vllms_count():
    assert cached_at_admission(cached_request("a", "x", 10, 5)) == 5
    assert cached_at_admission(cached_request("a", "x", 10, None)) is None
    assert cached_at_admission(SimpleNamespace(prefill_stats=SimpleNamespace(num_cached_tokens=True))) is None


# ---- the probe -----------------------------------------------------------------------------------------------------
def test_the_probe_asks_vllm_once_while_the_pool_is_unchanged():
    kv = FakeKVCacheManager({"a": 64})
    probe = PrefixProbe(kv)
    req = SimpleNamespace(item=FakeRequest("a", "x"))
    assert probe(req) == 64 and probe(req) == 64 and kv.asked == ["a"]
    kv.free -= 1  # a block taken in the pass: the pool changed
    kv.cached["a"] = 32
    assert probe(req) == 32 and kv.asked == ["a", "a"]
    probe.end_pass()  # blocks may be freed before the next pass
    assert probe(req) == 32 and kv.asked == ["a", "a", "a"]


def test_lpm_and_dlpm_need_prefix_caching_on():
    check_prefix_caching(FakeKVCacheManager(), "dlpm")
    with pytest.raises(ValueError, match="--enable-prefix-caching"):
        check_prefix_caching(FakeKVCacheManager(enable_caching=False), "dlpm")
    with pytest.raises(ValueError, match="get_computed_blocks"):
        check_prefix_caching(SimpleNamespace(enable_caching=True), "lpm")


def test_the_environment_names_dlpm_and_w_cached():
    c = VTCConfig.from_env({"FAIRSERVE_POLICY": "dlpm:500", "FAIRSERVE_W_CACHED": "0.1"})
    assert c.uses_prefix_cache and c.w_cached == 0.1 and c.make_policy().cost.name == "linear(1,2,cached=0.1)"
    assert not VTCConfig.from_env({}).uses_prefix_cache and VTCConfig.from_env({}).w_cached is None
    with pytest.raises(ValueError, match="FAIRSERVE_W_CACHED"):
        VTCConfig.from_env({"FAIRSERVE_W_CACHED": "cheap"})


# ---- the scheduler ---------------------------------------------------------------------------------------------------
class CachingScheduler(FakeScheduler):
    def __init__(self, vllm_config, *args, **kwargs) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        self.kv_cache_manager = vllm_config.kv


class CachingAsyncScheduler(CachingScheduler, FakeAsyncScheduler):
    pass


def engine(monkeypatch, policy: str, kv: FakeKVCacheManager):
    monkeypatch.setenv("FAIRSERVE_POLICY", policy)
    vtc, _ = scheduler_classes(CachingScheduler, CachingAsyncScheduler)
    cfg = config(True, max_running=1)
    cfg.kv = kv
    return vtc(cfg)


def admitted(s, steps: int) -> list[str]:
    """Request ids in the order the engine first scheduled them, over `steps` steps."""
    order: list[str] = []
    for _ in range(steps):
        out = s.schedule()
        order += [rid for rid in out.num_scheduled_tokens if rid not in order]
        s.update_from_output(out, SimpleNamespace(sampled={rid: [0] for rid in out.num_scheduled_tokens}))
    return order


def test_dlpm_admits_the_cached_request_of_a_tenant_in_credit_first(monkeypatch):
    kv = FakeKVCacheManager({"b-1": 96})  # bob's second request finds its system prompt cached
    s = engine(monkeypatch, "dlpm:1000", kv)
    for rid, client in (("a-0", "alice"), ("b-0", "bob"), ("b-1", "bob")):
        s.add_request(FakeRequest(rid, client, prompt=100, max_tokens=1))
    order = admitted(s, 4)
    assert order[0] == "b-1" and sorted(order) == ["a-0", "b-0", "b-1"], order
    assert s.fairserve_probe is not None and s.fairserve_probe.lookups >= 3


def test_vtc_on_the_same_engine_ignores_the_cache(monkeypatch):
    # the negative control: the same requests in arrival order, nothing asked of the cache
    kv = FakeKVCacheManager({"b-1": 96})
    s = engine(monkeypatch, "vtc", kv)
    for rid, client in (("a-0", "alice"), ("b-0", "bob"), ("b-1", "bob")):
        s.add_request(FakeRequest(rid, client, prompt=100, max_tokens=1))
    order = admitted(s, 4)
    assert order[0] == "a-0" and s.fairserve_probe is None and kv.asked == []


def test_dlpm_refuses_an_engine_without_prefix_caching(monkeypatch):
    with pytest.raises(ValueError, match="--enable-prefix-caching"):
        engine(monkeypatch, "dlpm", FakeKVCacheManager(enable_caching=False))
