"""vLLM's prefix cache, as the policy and the charges see it (`enable_prefix_caching=True`).

- **Ordering** (`lpm`, `dlpm[:QUANTUM]`): a policy that orders by cached prefix asks `Policy.cached` how many prompt
  tokens of a waiting request the cache holds now. `PrefixProbe` answers with vLLM's own lookup,
  `kv_cache_manager.get_computed_blocks(request)`, the one vLLM runs when it schedules the request (no side effect
  in 0.32 and 0.33: vLLM records its hit-rate statistics only at admission). The answer is remembered while the pool
  is unchanged: for the rest of the scheduling pass and as long as its count of free blocks stays the same (within a
  pass blocks are only taken, so a changed count is a changed pool).
- **Charges** (`FAIRSERVE_W_CACHED`): a request is priced at its first admission with the prompt tokens vLLM served
  from its cache, local and external (`cached_at_admission`: vLLM's own count for the request's first prefill, set
  before it pops the request). Without `w_cached` a cached token costs `w_p`, the paper's charge.
"""

from __future__ import annotations

from typing import Any

from ..core import Request


def cached_at_admission(request: Any) -> int | None:
    """The prompt tokens vLLM serves from a prefix cache at this first prefill (`prefill_stats`, set before vLLM
    pops the request); None where vLLM does not say (no stats, or a resumed request)."""
    stats = getattr(request, "prefill_stats", None)
    value = getattr(stats, "num_cached_tokens", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class PrefixProbe:
    """`Policy.cached` over vLLM's KV cache manager: how many of a waiting request's prompt tokens are cached now."""

    def __init__(self, kv_cache_manager: Any) -> None:
        self.manager = kv_cache_manager
        self._memo: dict[str, tuple[int, int]] = {}  # request id -> (free blocks when asked, cached tokens)
        self.lookups = 0  # vLLM lookups made (for tests and logs)

    def __call__(self, req: Request) -> int:
        request = req.item
        free = self._free_blocks()
        got = self._memo.get(request.request_id)
        if got is not None and got[0] == free:
            return got[1]
        self.lookups += 1
        tokens = int(self.manager.get_computed_blocks(request)[1])
        self._memo[request.request_id] = (free, tokens)
        return tokens

    def end_pass(self) -> None:
        """vLLM's `schedule()` returned: blocks may be freed before the next pass, so nothing remembered holds."""
        self._memo.clear()

    def _free_blocks(self) -> int:
        return int(self.manager.block_pool.get_num_free_blocks())


def check_prefix_caching(kv_cache_manager: Any, policy: str) -> None:
    """ValueError if a policy that orders by cached prefix runs on an engine without prefix caching."""
    if not callable(getattr(kv_cache_manager, "get_computed_blocks", None)):
        raise ValueError(f"FAIRSERVE_POLICY={policy!r}: this vLLM's KV cache manager has no get_computed_blocks")
    if not getattr(kv_cache_manager, "enable_caching", False):
        raise ValueError(
            f"FAIRSERVE_POLICY={policy!r} orders by vLLM's prefix cache, which is off: start vLLM with "
            "--enable-prefix-caching (LLM(..., enable_prefix_caching=True))"
        )
