"""Fairness and performance metrics over request records (offline analysis). Pure functions; no plotting.

Service is the paper's weighted tokens, W = w_p * prompt + w_q * output (with the cost's price for cached prompt
tokens, `RequestRecord.cached_tokens`, as the ledger charges: core/cost.py). A request's prompt counts when its first
token appears (the end of its prefill) and its output tokens are spread evenly from its first to its latest token,
as the paper's artifact does. A client is *backlogged* at time t when it has a request that arrived and was not yet
admitted. Comparisons between clients use service divided by the client's weight.

`summarize` costs O(events log events) in time and O(events) in memory: curves are read only where needed
(`Curves`), backlog is kept as runs (`backlog_runs`), Jain's index is summed from runs (`backlogged_jain`) and the
largest backlogged difference is found by a bounded exact search (`largest_backlogged_difference`), each for all
clients at once (numpy calls over every client's events, not a few dozen calls per client). The dense clients x
times functions (`service_curves`, `backlogged`, `backlogged_difference`, `windowed_jain`) serve figures and are
the test oracles.
"""

from .curves import (
    Curves,
    ServiceCurve,
    backlog_runs,
    backlogged,
    by_client,
    prepare_curves,
    response_times,
    service_curves,
    service_rates,
    time_grid,
)
from .difference import (
    MIN_WORK,
    WORK_PER_EVENT,
    BackloggedDifference,
    backlogged_difference,
    largest_backlogged_difference,
)
from .summary import (
    ClientStats,
    Summary,
    backlogged_jain,
    client_stats,
    describe_difference,
    jain,
    jain_window,
    summarize,
    summary_table,
    windowed_jain,
)

__all__ = [
    "Curves",
    "ServiceCurve",
    "backlog_runs",
    "backlogged",
    "by_client",
    "prepare_curves",
    "response_times",
    "service_curves",
    "service_rates",
    "time_grid",
    "MIN_WORK",
    "WORK_PER_EVENT",
    "BackloggedDifference",
    "backlogged_difference",
    "largest_backlogged_difference",
    "ClientStats",
    "Summary",
    "backlogged_jain",
    "client_stats",
    "describe_difference",
    "jain",
    "jain_window",
    "summarize",
    "summary_table",
    "windowed_jain",
]
