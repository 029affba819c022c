"""Cost functions h(x, y): the service of a request with x prompt tokens and y output tokens so far.

The paper charges h(x, 0) at admission and h(x, y) - h(x, y-1) for the y-th output token; any monotone h works.
A request whose prompt was partly served from a prefix cache (`Request.cached_tokens`) is charged
h(x, y) + `cached(x, c)`: 0 unless the linear cost has its own price for cached prompt tokens (`w_cached`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class CostFunction:
    """h(x, y). Subclasses may override `prompt`/`output` with a closed form (the linear one does, for speed)."""

    name = "custom"

    def __init__(self, h: Callable[[int, int], float], name: str = "custom") -> None:
        self.h = h
        self.name = name

    def total(self, x: int, y: int) -> float:
        return self.h(x, y)

    def prompt(self, x: int) -> float:
        """Charged at admission."""
        return self.h(x, 0)

    def output(self, x: int, y0: int, y1: int) -> float:
        """Cost of output tokens y0+1 .. y1."""
        return self.h(x, y1) - self.h(x, y0)

    def cached(self, x: int, c: int) -> float:
        """What `c` of the x prompt tokens being served from a prefix cache changes in the charge: h has no price of
        its own for them, so nothing."""
        return 0.0


@dataclass(frozen=True)
class LinearCost(CostFunction):
    """The paper's default: W = w_p * prompt_tokens + w_q * output_tokens. With `w_cached` (None: w_p, the paper's
    charge), the c prompt tokens served from a prefix cache cost w_cached each: w_p * (x - c) + w_cached * c."""

    w_p: float = 1.0
    w_q: float = 2.0
    w_cached: float | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        cached = "" if self.w_cached is None else f",cached={self.w_cached:g}"
        return f"linear({self.w_p:g},{self.w_q:g}{cached})"

    def total(self, x: int, y: int) -> float:
        return self.w_p * x + self.w_q * y

    def prompt(self, x: int) -> float:
        return self.w_p * x

    def output(self, x: int, y0: int, y1: int) -> float:
        return self.w_q * (y1 - y0)

    def cached(self, x: int, c: int) -> float:
        # NOTE: at most the prompt: an engine may count tokens beyond it (a chat template's) as cached
        return 0.0 if self.w_cached is None else (self.w_cached - self.w_p) * min(c, x)


def profiled_a10g_llama2_7b(x: int, y: int) -> float:
    """The paper's profiled cost for Llama-2-7b on an A10G (§5, 'profiled cost function')."""
    return 0.21001891 * x + 0.10075395 * y + 0.0039868 * x * y + 0.00324733 * y * y + 1.14601454


COSTS: dict[str, Callable[[], CostFunction]] = {
    "linear": LinearCost,
    "profiled": lambda: CostFunction(profiled_a10g_llama2_7b, "profiled-a10g-llama2-7b"),
}


def make_cost(
    spec: str | CostFunction | Callable[[int, int], float] | None = None,
    w_p: float = 1.0,
    w_q: float = 2.0,
    w_cached: float | None = None,
) -> CostFunction:
    """`None`/"linear" -> LinearCost(w_p, w_q, w_cached); "profiled" -> the A10G profile; a callable h(x, y) ->
    CostFunction. A price for cached prompt tokens (`w_cached`) is the linear cost's only."""
    if spec is None or spec == "linear":
        if w_p < 0 or w_q < 0 or (w_cached is not None and w_cached < 0):
            raise ValueError(f"cost weights must be >= 0, got w_p={w_p}, w_q={w_q}, w_cached={w_cached}")
        return LinearCost(w_p, w_q, w_cached)
    if w_cached is not None:
        raise ValueError(f"a price for cached prompt tokens (w_cached) needs the linear cost, not {spec!r}")
    if isinstance(spec, CostFunction):
        return spec
    if callable(spec):
        return CostFunction(spec, getattr(spec, "__name__", "custom"))
    if spec in COSTS:
        return COSTS[spec]()
    raise ValueError(f"unknown cost function {spec!r}; choose one of: {', '.join(COSTS)}")
