"""Sweeps: a grid of simulations run in parallel (local processes or a Ray cluster), resumable, aggregated over seeds
into tables and figures (`fairserve sweep`; docs/sweeps.md)."""

from .runner import LocalRunner, Outcome, RayRunner, Runner, make_runner
from .spec import Point, Source, SweepConfig, SweepError, from_mapping, load_toml, parse_seeds
from .stats import Interval, mean_ci, t_quantile
from .store import Store, code_version, source_digest

__all__ = [
    "Interval",
    "LocalRunner",
    "Outcome",
    "Point",
    "RayRunner",
    "Runner",
    "Source",
    "Store",
    "SweepConfig",
    "SweepError",
    "code_version",
    "from_mapping",
    "load_toml",
    "make_runner",
    "mean_ci",
    "parse_seeds",
    "source_digest",
    "t_quantile",
]
