"""The dashboard's data (`GET /admin/dashboard`, history of service rates), its page, `POST /admin/owners`,
`fairserve top` and `fairserve bench --admin-key` against a gateway in front of a fake backend."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.gateway import ADMIN, HTTP, KEYS, FakeBackend, admin_tenants, auth, chat_body, serve

from fairserve.cli import main
from fairserve.core import LedgerView, TenantView
from fairserve.dashboard import HISTORY_S, MAX_POINTS, MAX_SAMPLES, MIN_INTERVAL_S, RATE_WINDOW_S, History, snapshot
from fairserve.top import render

pytestmark = pytest.mark.integration

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def view(services: dict[str, float], queued: dict[str, int] | None = None) -> LedgerView:
    q = queued or {}
    return LedgerView("vtc", {t: TenantView(t, 1.0, s, s, q.get(t, 0), 0) for t, s in services.items()})


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.floats(0.0, 30.0), min_size=1, max_size=400),
    rates=st.tuples(st.floats(0, 1e4), st.floats(0, 1e4)),
)
def test_history_is_bounded_and_rates_are_exact_for_steady_service(steps, rates):
    clock, h = Clock(), History()
    h.clock = clock
    start, tenants = clock.now, ["a", "b"]
    for dt in steps:
        clock.now += dt
        elapsed = clock.now - start
        h.sample(view({"a": rates[0] * elapsed, "b": rates[1] * elapsed}), tenants)
    assert len(h.samples) <= MAX_SAMPLES
    assert all(clock.now - s.t <= HISTORY_S for s in h.samples)
    assert all(b.t - a.t >= MIN_INTERVAL_S for a, b in zip(h.samples, list(h.samples)[1:], strict=False))
    times, series = h.rates()
    # every sample has a rate but the very first (none before it), which the history may since have dropped
    rated = [s for s in h.samples if s.rate is not None]
    assert len(rated) >= len(h.samples) - 1 and all(s.rate is None for s in h.samples if s.t == start + steps[0])
    assert len(times) == len(series["a"]) == len(series["b"]) <= min(MAX_POINTS, len(rated))
    assert all(-HISTORY_S <= t <= 0 for t in times) and times == sorted(times)
    if len(h.samples) > 1 and h.samples[-1].t - h.samples[-2].t <= RATE_WINDOW_S:
        assert times[-1] == 0  # the latest sample is always on the chart
    for got, want in ((series["a"], rates[0]), (series["b"], rates[1])):
        assert all(v == pytest.approx(want, rel=1e-6, abs=0.01) for v in got)


def test_rate_covers_the_window_before_each_sample():
    clock, h = Clock(), History()
    h.clock = clock
    service = 0.0
    for second in range(20):
        clock.now += 1
        service += 100 if second < 10 else 0  # 100 service/s for 10 s, then nothing
        h.sample(view({"a": service}), ["a"])
    times, series = h.rates()
    assert times[-1] == 0 and series["a"][-1] == 0.0
    assert series["a"][int(RATE_WINDOW_S)] == pytest.approx(100)  # a full window inside the busy part
    doc = snapshot(view({"a": service}), ["a", "nobody"], h)
    assert [t["name"] for t in doc["tenants"]] == ["a"] and doc["tenants"][0]["rate"] == 0.0


def test_after_an_idle_gap_the_rate_is_over_the_gap_not_the_last_one_before_it():
    clock, h = Clock(), History()
    h.clock = clock
    for second in range(1, 4):  # 1,000 service/s for 3 s
        clock.now += 1
        h.sample(view({"a": 1000.0 * second}), ["a"])
    assert snapshot(view({"a": 3000.0}), ["a"], h)["history"]["rate_span_s"] == 2.0  # within the window
    clock.now += 120  # nothing happened for two minutes (top --once, or the page opened again)
    doc = snapshot(view({"a": 3000.0}), ["a"], h)
    assert doc["tenants"][0]["rate"] == 0.0 and doc["history"]["rates"]["a"][-1] == 0.0
    clock.now += 26
    doc = snapshot(view({"a": 4300.0}), ["a"], h)  # 1,300 more over 26 s
    assert doc["tenants"][0]["rate"] == pytest.approx(50.0) and doc["history"]["rate_span_s"] == 26.0
    # what `top` prints under its table says so, not the usual window
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(render(doc, "http://gw"))
    assert "service/s over the last 26 s" in console.export_text()


def test_snapshot_reports_fairness_among_backlogged_tenants():
    v = view({"a": 10.0, "b": 30.0, "c": 99.0}, queued={"a": 1, "b": 2})
    doc = snapshot(v, ["a", "b", "c"], History(), backends=lambda: [{"url": "u"}])
    assert doc["backlogged"] == ["a", "b"] and doc["counter_spread"] == 20.0
    assert doc["jain"] == pytest.approx((10 + 30) ** 2 / (2 * (10**2 + 30**2)))
    assert doc["backends"] == [{"url": "u"}]
    assert snapshot(v, ["a"], History())["backends"] is None


def test_dashboard_data_page_and_owners_on_the_gateway():
    with serve(FakeBackend(delay_s=0.001), weight_alice=2) as base:
        for headers, status in [({}, 401), ({"Authorization": "Bearer wrong"}, 401), (auth("alice"), 403)]:
            r = HTTP.get(base + "/admin/dashboard", headers=headers)
            assert r.status_code == status and "error" in r.json()
        for tenant in KEYS:
            assert HTTP.post(base + "/v1/chat/completions", json=chat_body(4), headers=auth(tenant)).status_code == 200
        doc = HTTP.get(base + "/admin/dashboard", headers=ADMIN_H).json()
        rows = {t["name"]: t for t in doc["tenants"]}
        admin = admin_tenants(base)
        for name, row in rows.items():
            assert {k: v for k, v in row.items() if k != "rate"} == admin[name]
        assert rows["alice"]["weight"] == 2.0 and doc["policy"] == "vtc"
        assert doc["rate_caps"] is None  # no caps configured: the page hides their card
        (backend,) = doc["backends"]
        assert backend["healthy"] is True and backend["limit_requests"] >= 1 and backend["in_flight_requests"] == 0

        page = HTTP.get(base + "/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert "alice" not in page.text and ADMIN not in page.text  # the page holds no data
        srcs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert srcs and all(s.startswith("/dashboard/") for s in srcs)  # nothing from elsewhere
        for src in srcs:
            assert HTTP.get(base + src).status_code == 200
        assert '<link rel="icon" href="/dashboard/' in page.text  # else a browser asks for /favicon.ico: a 404
        assert "/admin/dashboard" in HTTP.get(base + "/dashboard/dashboard.js").text

        r = HTTP.post(base + "/admin/owners", json={"keys": [KEYS["alice"], "nope"]}, headers=ADMIN_H)
        assert r.json() == {"owners": {KEYS["alice"]: "alice", "nope": None}}
        assert HTTP.post(base + "/admin/owners", json={"keys": []}, headers=auth("bob")).status_code == 403
        for body in (b"{}", b'{"keys": "k"}', b'{"keys": [1]}', b"nope", json.dumps({"keys": ["k"] * 1001}).encode()):
            assert HTTP.post(base + "/admin/owners", content=body, headers=ADMIN_H).status_code == 400, body


def _numbers(line: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"-?[\d,]*\.?\d+", line)]


def test_top_once_matches_the_admin_api(capsys):
    with serve(FakeBackend(), weight_alice=2) as base:
        for tenant, n in (("alice", 7), ("bob", 3)):
            assert HTTP.post(base + "/v1/chat/completions", json=chat_body(n), headers=auth(tenant)).status_code == 200
        assert main(["top", "--target", base, "--admin-key", ADMIN, "--once", "--interval", "0.6"]) == 0
        out = capsys.readouterr().out
        admin = admin_tenants(base)
        for name, row in admin.items():
            (line,) = [x for x in out.splitlines() if re.search(rf"\b{name}\b", x)]
            weight, rate, service, counter, queued, in_flight = _numbers(line)
            assert weight == row["weight"] and rate == 0.0  # nothing served between the two looks
            assert service == round(row["service"]) and counter == round(row["counter"], 1)
            assert (queued, in_flight) == (row["queue_length"], row["in_flight"]) == (0, 0)
        assert "policy vtc" in out and "backends" in out and "healthy" in out

        assert main(["top", "--target", base, "--admin-key", "wrong", "--once"]) == 2
        assert "refused the admin key" in capsys.readouterr().err
    assert main(["top", "--target", "localhost:1", "--admin-key", "k", "--once"]) == 2
    assert "bad --target" in capsys.readouterr().err


def test_bench_scores_with_the_gateways_weights(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    rows = [f"{i * 0.1},{'c0' if i % 2 else 'c1'},12,3" for i in range(8)]
    trace.write_text("arrival_time_s,client,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "bench.json"
    with serve(FakeBackend(), weight_alice=2) as base:
        argv = [
            "bench",
            "--target",
            base,
            "--trace",
            str(trace),
            "--time-scale",
            "10",
            "--keys",
            f"c0={KEYS['alice']},c1={KEYS['bob']}",
            "--json",
            str(out),
        ]
        assert main([*argv, "--admin-key", ADMIN]) == 0
        text = capsys.readouterr()
        assert "c0=2 (alice), c1=1 (bob)" in text.out
        assert "8/8" in text.err  # the progress bar reached the end
        assert json.loads(out.read_text())["summary"]["weights"] == {"c0": 2.0, "c1": 1.0}

        assert main([*argv, "--admin-key", "wrong"]) == 2
        assert "refused" in capsys.readouterr().err
        assert main([*argv[:-4], "--keys", "c0=unknown,c1=kb", "--admin-key", ADMIN]) == 2
        # NOTE: the target is asked first (after --wait), and refuses the key before its admin API is read
        assert "refused the API key of client" in capsys.readouterr().err
        with pytest.raises(SystemExit) as e:  # one source of weights
            main([*argv, "--admin-key", ADMIN, "--weights", "c0=1"])
        assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err
