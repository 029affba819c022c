"""Settings for the whole suite."""

import os

# NOTE: one intra-op thread per process. The suite runs on pytest-xdist workers and starts servers beside them;
# torch's default (a thread per core in every process) oversubscribes the cores: the transformers tests ran ~4x slower
os.environ.setdefault("OMP_NUM_THREADS", "1")
