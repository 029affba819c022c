"""Settings for the whole suite."""

import os

from hypothesis import settings

# NOTE: one intra-op thread per process. The suite runs on pytest-xdist workers and starts servers beside them;
# torch's default (a thread per core in every process) oversubscribes the cores: the transformers tests ran ~4x slower
os.environ.setdefault("OMP_NUM_THREADS", "1")

# NOTE: under CI the properties draw the same examples on every run, so a submission passes or fails on its code, not
# on the draw; runs elsewhere draw new examples each time (how rare counterexamples are found)
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")
