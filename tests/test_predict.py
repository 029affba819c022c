"""VTC with output-length prediction: charge ahead, charge beyond, refund at finish; the predictors."""

import pytest

from fairserve.core import Ledger, MovingAveragePredictor, NoisyOraclePredictor, Request, make_policy, make_predictor

pytestmark = pytest.mark.unit


def req(i, client, prompt=10, true_len=20, max_tokens=None):
    return Request(
        id=i, tenant=client, prompt_tokens=prompt, max_tokens=max_tokens or true_len, predicted_output=true_len
    )


def test_oracle_charges_prediction_at_admission_and_nothing_more():
    p = Ledger(make_policy("vtc-predict:oracle"))
    r = req(1, "a", prompt=10, true_len=20)
    p.add(r)
    p.pop()
    assert p.counters["a"] == 10 + 2 * 20
    p.output(r, 20)
    assert p.counters["a"] == 50
    p.settle(r)
    assert p.counters["a"] == 50


def test_underestimate_charges_beyond_prediction():
    p = Ledger(make_policy("vtc-predict", cost=None))
    p.predictor = make_predictor("oracle")
    r = Request(id=1, tenant="a", prompt_tokens=10, max_tokens=100, predicted_output=5)
    p.add(r)
    p.pop()
    assert p.counters["a"] == 20
    p.output(r, 3)
    assert p.counters["a"] == 20  # within the prediction
    p.output(r, 4)  # 7 tokens: 2 beyond
    assert p.counters["a"] == 24
    p.settle(r)
    assert p.counters["a"] == 24


def test_overestimate_is_refunded_at_finish_and_abort():
    p = Ledger(make_policy("vtc-predict:oracle"))
    r = Request(id=1, tenant="a", prompt_tokens=10, max_tokens=100, predicted_output=50)
    p.add(r)
    p.pop()
    p.output(r, 8)
    assert p.counters["a"] == 110
    p.settle(r)
    assert p.counters["a"] == 10 + 16  # refund of 42 unused predicted tokens
    r2 = Request(id=2, tenant="a", prompt_tokens=10, max_tokens=100, predicted_output=50)
    p.add(r2)
    p.pop()
    p.output(r2, 3)
    p.settle(r2, cancelled=True)
    assert p.counters["a"] == 26 + 10 + 6


def test_refund_reorders_heap():
    p = Ledger(make_policy("vtc-predict:oracle"))
    a = Request(id=1, tenant="a", prompt_tokens=10, max_tokens=500, predicted_output=400)
    b = Request(id=2, tenant="b", prompt_tokens=300, max_tokens=10, predicted_output=10)
    p.add(a), p.add(b)
    p.pop(), p.pop()  # a: 810, b: 320
    p.add(Request(id=4, tenant="b", prompt_tokens=1, predicted_output=1))  # no one else queued: no lift
    p.add(Request(id=3, tenant="a", prompt_tokens=1, predicted_output=1))  # max(810, 320): stays
    assert p.peek().tenant == "b"
    p.output(a, 1)
    p.settle(a)  # a refunded down to 12
    assert p.counters["a"] == 12
    assert p.peek().tenant == "a"


def test_noisy_oracle_is_bounded_and_seeded():
    r = req(1, "a", true_len=200)
    preds = [NoisyOraclePredictor(50, seed=7).predict(r) for _ in range(3)]
    assert preds[0] == preds[1] == preds[2]
    many = NoisyOraclePredictor(50, seed=1)
    vals = [many.predict(r) for _ in range(500)]
    assert min(vals) >= 100 and max(vals) <= 300
    assert min(vals) < 120 and max(vals) > 280
    assert make_predictor("oracle±50").frac == 0.5 and make_predictor("oracle+-25%").frac == 0.25


def test_moving_average_window_5_capped_by_max_tokens():
    m = MovingAveragePredictor()
    r = Request(id=1, tenant="a", prompt_tokens=1, max_tokens=1000)
    assert m.predict(r) == 0  # no history
    m.observe(r, 100)
    assert m.predict(r) == 100  # seeded with the first length
    m.observe(r, 200)
    assert m.predict(r) == 120  # (100*4 + 200)/5
    capped = Request(id=2, tenant="a", prompt_tokens=1, max_tokens=50)
    assert m.predict(capped) == 50
    assert m.predict(Request(id=3, tenant="b", prompt_tokens=1)) == 0  # per client


def test_moving_average_learns_inside_the_policy():
    p = Ledger(make_policy("vtc-predict:moving-average"))
    for i in range(3):
        r = Request(id=i, tenant="a", prompt_tokens=0, max_tokens=1000)
        p.add(r)
        p.pop()
        p.output(r, 100)
        p.settle(r)
    r = Request(id=9, tenant="a", prompt_tokens=0, max_tokens=1000)
    p.add(r)
    before = p.counters["a"]
    p.pop()
    assert p.counters["a"] - before == pytest.approx(200)  # predicted 100 tokens x w_q
