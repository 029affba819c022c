"""`fairserve reproduce`: the paper's evaluation on the simulated engine, with figures and a report."""
from .experiments import EXPERIMENTS, Experiment
from .runner import reproduce

__all__ = ["EXPERIMENTS", "Experiment", "reproduce"]
