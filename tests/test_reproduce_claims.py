"""Each of the paper's claims, on the shortened (--quick) workloads: the verdict is computed from the simulation and
must hold; where the paper says a baseline is unfair, the verdict checks that too."""
from functools import cache

import pytest

from fairserve.reproduce.experiments import EXPERIMENTS, PREDICTORS, Results
from fairserve.reproduce.runs import REAL, RunSpec, run, trace_available

BY_NAME = {e.name: e for e in EXPERIMENTS}
HAVE_REAL = trace_available(None)


@cache
def quick(spec: RunSpec):
    return run(spec, quick=True)


def results(exp, drop_real=False) -> Results:
    return Results({(r.workload, r.name): quick(r) for r in exp.runs if not (drop_real and r.workload == REAL)})


SYNTHETIC = [e.name for e in EXPERIMENTS if all(r.workload != REAL for r in e.runs)]
NEED_REAL = [e.name for e in EXPERIMENTS if all(r.workload == REAL for r in e.runs)]


@pytest.mark.parametrize("name", SYNTHETIC)
def test_claim_holds_on_synthetic_workloads(name):
    holds, evidence = BY_NAME[name].judge(results(BY_NAME[name]))
    assert holds, evidence


@pytest.mark.skipif(not HAVE_REAL, reason="the Chatbot Arena trace (shared/traces) is not present")
@pytest.mark.parametrize("name", [n for n in NEED_REAL if n != "real"] + ["profiled-cost", "bound"])
def test_claim_holds_on_the_real_trace(name):
    holds, evidence = BY_NAME[name].judge(results(BY_NAME[name]))
    assert holds, evidence


@pytest.mark.parametrize("name", ["profiled-cost", "bound"])
def test_mixed_claims_hold_without_the_trace(name):
    holds, evidence = BY_NAME[name].judge(results(BY_NAME[name], drop_real=True))
    assert holds, evidence


def test_length_prediction_lowers_discrepancy_on_synthetic_overload():
    exp = BY_NAME["length-prediction"]
    holds, evidence = exp.judge(results(exp, drop_real=True))
    assert holds, evidence
    res = results(exp, drop_real=True)
    for w in ("overload", "overload-multi"):
        base = res[w, "vtc"].summary.max_backlogged_diff
        assert all(res[w, p].summary.max_backlogged_diff < base for p in PREDICTORS)


@pytest.mark.skipif(not HAVE_REAL, reason="the Chatbot Arena trace (shared/traces) is not present")
def test_length_prediction_on_real_is_reported_as_measured():
    # On the resampled Arena trace prediction does not reliably lower the discrepancy (measured, see README);
    # the verdict must say so rather than claim it.
    exp = BY_NAME["length-prediction"]
    res = results(exp)
    holds, evidence = exp.judge(res)
    base = res[REAL, "vtc"].summary.max_backlogged_diff
    lower = all(res[REAL, p].summary.max_backlogged_diff < base for p in PREDICTORS[:2])
    assert holds is lower
    assert "real: VTC" in evidence


@pytest.mark.skipif(not HAVE_REAL, reason="the Chatbot Arena trace (shared/traces) is not present")
def test_real_verdict_is_reported_as_measured():
    # FCFS raises the median client's response time by far more than 3x; whether every slow client under VTC asked
    # above the fair share over the whole run is reported as measured (one bursty client does not, see README).
    exp = BY_NAME["real"]
    holds, evidence = exp.judge(results(exp))
    med = [float(x.split(" s")[0]) for x in evidence.split("median client response ")[1].split(" and ")[:2]]
    assert med[1] >= 3 * med[0]
    slow, above = (int(evidence.split(k)[0].split()[-1].strip("(")) for k in (" client(s) waited", " asked for more"))
    assert holds is (slow == above)
