"""Output-length predictors for VTC with length prediction (the paper's appendix)."""

from __future__ import annotations

import re

import numpy as np

from .request import Request


class Predictor:
    """Predicts a request's output length at admission; learns from finished requests."""

    name = "predictor"

    def predict(self, req: Request) -> int:
        raise NotImplementedError

    def observe(self, req: Request, output_tokens: int) -> None:
        """Called once per finished request with its true output length."""


def _cap(req: Request, n: int) -> int:
    return max(0, min(n, req.max_tokens) if req.max_tokens is not None else n)


class OraclePredictor(Predictor):
    """The true length, which the driver passes as `predicted_output` (the simulator knows it)."""

    name = "oracle"

    def predict(self, req: Request) -> int:
        if req.predicted_output is not None:
            return req.predicted_output
        return req.max_tokens or 0


class NoisyOraclePredictor(OraclePredictor):
    """The true length, wrong by a uniform factor in [-x%, +x%] (seeded)."""

    def __init__(self, percent: float, seed: int = 0) -> None:
        if not 0 <= percent < 100:
            raise ValueError(f"oracle error must be in [0, 100) percent, got {percent}")
        self.frac = percent / 100.0
        self.name = f"oracle±{percent:g}%"
        self._rng = np.random.default_rng(seed)

    def predict(self, req: Request) -> int:
        true = super().predict(req)
        return max(0, round(true * (1.0 + self._rng.uniform(-self.frac, self.frac))))


class MovingAveragePredictor(Predictor):
    """The paper artifact's practical predictor: per tenant, a moving average of finished output lengths with
    window 5, kept as `avg = (avg * (window - 1) + latest) / window` and seeded with the first observed length.
    A tenant with no finished request yet is predicted 0 (charged as it decodes, like plain VTC).
    Predictions are capped by the request's max tokens."""

    name = "moving-average"

    def __init__(self, window: int = 5) -> None:
        if window < 1:
            raise ValueError("moving-average window must be >= 1")
        self.window = window
        self.average: dict[str, float] = {}

    def predict(self, req: Request) -> int:
        return _cap(req, round(self.average.get(req.tenant, 0.0)))

    def observe(self, req: Request, output_tokens: int) -> None:
        old = self.average.get(req.tenant)
        self.average[req.tenant] = (
            output_tokens if old is None else (old * (self.window - 1) + output_tokens) / self.window
        )


_NOISY = re.compile(r"^oracle(?:\+-|±|-+|\+)(\d+(?:\.\d+)?)%?$")


def make_predictor(spec: str | Predictor, seed: int = 0) -> Predictor:
    """ "oracle", "oracle±50" (also "oracle+-50%"), "moving-average"/"ma" (window 5)."""
    if isinstance(spec, Predictor):
        return spec
    if spec == "oracle":
        return OraclePredictor()
    if spec in ("moving-average", "ma"):
        return MovingAveragePredictor()
    m = _NOISY.match(spec)
    if m:
        return NoisyOraclePredictor(float(m.group(1)), seed)
    raise ValueError(f"unknown predictor {spec!r}; choose oracle, oracle±X (e.g. oracle±50), or moving-average")
