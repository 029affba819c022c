"""Load test: streamed requests through the gateway to a faulty emulator, 64 at a time. Nothing is lost: every
request ends in exactly one outcome, at the client and in the gateway's metrics. The suite sends 600;
benchmarks/load.py runs the same with 10,000 (and reports the rate)."""

import pytest
from support.load import check_nothing_lost, run_load

pytestmark = pytest.mark.integration

REQUESTS = 600


def test_streams_with_faults_lose_nothing():
    check_nothing_lost(REQUESTS, *run_load(REQUESTS))
