"""What a request is charged, in the ledger's one unit (service): the arithmetic of every charge, kept apart from the
life cycle that decides when a charge is made (core/ledger.py).

A request's price is its own (`Request.cost`: its model's) or the policy's. It is charged at admission its prompt
and, for a policy with a predictor, its predicted output; each output token beyond the prediction as decoded; and at
settle the difference to its final total. Prompt tokens served from a prefix cache change every one of these by
the cost's `cached` price (0 unless a linear cost has its own `w_cached`)."""

from __future__ import annotations

from .cost import CostFunction, LinearCost
from .request import Request


def linear_w_q(cost: CostFunction) -> float | None:
    """A linear cost's per-token output price (the ledger's fast path), else None."""
    return cost.w_q if type(cost) is LinearCost else None


def cached_price(cost: CostFunction, req: Request) -> float:
    """What its cached prompt tokens change in a request's charge."""
    return cost.cached(req.prompt_tokens, req.cached_tokens)


def admission(cost: CostFunction, req: Request, predicted: bool) -> float:
    """The charge at admission: the prompt, and the predicted output (`req.predicted`) when `predicted`."""
    amount = cost.prompt(req.prompt_tokens) + cached_price(cost, req)
    if predicted:
        amount += cost.output(req.prompt_tokens, 0, req.predicted)
    return amount


def beyond_prediction(cost: CostFunction, w_q: float | None, req: Request, y0: int, y1: int) -> float:
    """The charge of output tokens y0..y1 (either way: y1 < y0 takes them back), only those beyond the prediction."""
    p = req.predicted
    lo, hi = max(y0, p), max(y1, p)
    return w_q * (hi - lo) if w_q is not None else cost.output(req.prompt_tokens, lo, hi)


def expected(cost: CostFunction, req: Request) -> float:
    """What an admitted request stands charged at now, by its counts."""
    return cost.total(req.prompt_tokens, max(req.output_done, req.predicted)) + cached_price(cost, req)


def final(cost: CostFunction, req: Request) -> float:
    """What a request's whole charge comes to at settle: its prompt and the output it produced."""
    return cost.total(req.prompt_tokens, req.output_done) + cached_price(cost, req)
