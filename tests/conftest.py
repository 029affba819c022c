"""Settings for the whole suite (the main tier, and the Python 3.12 and vLLM tiers that run some of its files)."""

import os

# NOTE: one intra-op thread per process. The suite runs on pytest-xdist workers and starts servers beside them;
# torch's default (a thread per core in every process) oversubscribes the cores: the transformers tests ran ~4x slower
os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    from hypothesis import settings
except ImportError:  # NOTE: the Python 3.12 tier's venv has the package and pytest only, and runs no properties
    settings = None

# NOTE: under CI the properties draw the same examples on every run, so a submission passes or fails on its code, not
# on the draw; runs elsewhere draw new examples each time (how rare counterexamples are found)
if settings is not None:
    settings.register_profile("ci", derandomize=True)
    if os.environ.get("CI") == "true":
        settings.load_profile("ci")
