"""`fairserve reproduce`: the paper's evaluation on the simulated engine, with figures and a report."""

from .experiments import ALL_EXPERIMENTS, EXPERIMENTS, OWN_FINDINGS, Experiment
from .runner import reproduce

__all__ = ["ALL_EXPERIMENTS", "EXPERIMENTS", "OWN_FINDINGS", "Experiment", "reproduce"]
