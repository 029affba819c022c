"""The `fairserve bench` command against the fake OpenAI-compatible server: its table, JSON and plots, named
workloads, bad input, several targets, and the order of its checks before a run."""

from __future__ import annotations

import json
import time

import pytest
from support.fake_openai import FIELDS, fake, parse_bench

from fairserve.bench.cli import run
from fairserve.workloads import Arrival

pytestmark = pytest.mark.integration

__all__ = ["fake"]  # NOTE: the fixture, imported so that pytest finds it here


def test_cli_table_json_and_plots(fake, tmp_path, capsys):
    _, url = fake
    trace = tmp_path / "t.csv"
    rows = [f"{i * 0.5},{'a' if i % 2 else 'b'},{12 + i},{3 + i % 3}" for i in range(8)]
    trace.write_text("arrival_time_s,client,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    out, plots = tmp_path / "bench.json", tmp_path / "plots"
    args = parse_bench(
        "--target",
        url,
        "--trace",
        str(trace),
        "--keys",
        "a=ka,*=kb",
        "--time-scale",
        "10",
        "--weights",
        "a=1,b=2",
        "--json",
        str(out),
        "--plots",
        str(plots),
    )
    assert run(args) == 0
    text = capsys.readouterr().out
    for word in (
        "client",
        "service",
        "svc/s",
        "resp mean",
        "p90",
        "e2e mean",
        "throughput",
        "Jain's index",
        "max service difference",
    ):
        assert word in text
    assert any(line.startswith("a ") for line in text.splitlines())
    # 3.5 workload seconds at 10x, then up to the timeout (600 s) for the last answers: the wait is part of the run
    assert "sent over about 0.35 s of wall time, then up to 600 s more for the last answers" in text
    doc = json.loads(out.read_text())
    assert set(doc) == {"summary", "requests"}
    assert set(doc["summary"]["clients"]) == {"a", "b"} and doc["summary"]["weights"] == {"a": 1.0, "b": 2.0}
    assert "jain_index" in doc["summary"] and "max_backlogged_diff" in doc["summary"]
    assert len(doc["requests"]) == 8
    for r in doc["requests"]:
        assert FIELDS <= set(r) and r["status"] == "finished" and r["http_status"] == 200
    for name in ("service_rate.png", "response_time.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_named_workload_and_errors(fake, tmp_path, capsys):
    _, url = fake
    args = parse_bench(
        "--target",
        url,
        "--workload",
        "overload",
        "--duration",
        "2",
        "--time-scale",
        "20",
        "--keys",
        "*=fast",
        "--endpoint",
        "chat",
    )
    assert run(args) == 0
    assert "client-0" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no API key"):
        run(parse_bench("--target", url, "--workload", "overload", "--duration", "2", "--keys", "client-0=k"))
    with pytest.raises(ValueError, match="trace file not found"):
        run(parse_bench("--target", url, "--trace", str(tmp_path / "nope.csv"), "--keys", "*=k"))
    with pytest.raises(ValueError, match="weights"):
        run(
            parse_bench("--target", url, "--workload", "overload", "--duration", "2", "--keys", "*=k", "--weights", "x")
        )
    with pytest.raises(SystemExit):  # --workload and --trace are exclusive
        parse_bench("--target", url, "--workload", "overload", "--trace", "t.csv", "--keys", "*=k")


def test_cli_client_xargs_reaches_the_server(fake, capsys):
    f, url = fake
    before = len(f.seen)
    args = parse_bench(
        "--target",
        url,
        "--workload",
        "overload",
        "--duration",
        "1",
        "--time-scale",
        "20",
        "--keys",
        "*=fast",
        "--client-xargs",
        "tenant",
    )
    assert run(args) == 0
    seen = f.seen[before:]
    assert seen and all(s["body"]["vllm_xargs"] == {"tenant": s["client"]} for s in seen)
    assert "client-0" in capsys.readouterr().out


def test_an_unreachable_target_or_a_refused_key_is_one_error_before_the_run(fake, capsys):
    from fairserve.api.server import free_port
    from fairserve.cli import main

    _, url = fake
    common = ["--workload", "overload", "--duration", "2", "--time-scale", "20", "--no-progress"]
    nowhere = f"http://127.0.0.1:{free_port()}"
    for target, keys, message in [
        (nowhere, "*=fast", f"cannot reach the target {nowhere}"),
        (url, "client-0=fast,client-1=badkey", "refused the API key of client 'client-1'"),
    ]:
        start = time.monotonic()
        assert main(["bench", "--target", target, "--keys", keys, *common]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert time.monotonic() - start < 5  # at once, not after the workload's duration
    # with --wait: it waits for the target, then gives up with the same error
    assert main(["bench", "--target", nowhere, "--keys", "*=fast", "--wait", "0.5", *common]) == 2
    capsys.readouterr()
    f, _ = fake
    assert main(["bench", "--target", url, "--keys", "*=fast", *common]) == 0
    assert f.seen[-1]["body"]["model"] == "m"  # no --model: the one the target lists


def test_bench_places_requests_on_several_targets():
    from fairserve.bench.runner import place

    arrivals = [
        Arrival(arrival_s=t, client=c, prompt_tokens=5, output_tokens=5)
        for c, t in [("b", 0.3), ("a", 0.0), ("a", 0.1), ("b", 0.2)]
    ]
    targets = "http://r1:1,http://r2:2/v1"
    assert place(targets, arrivals, "completions") == [f"http://r{k}:{k}/v1/completions" for k in (2, 1, 2, 1)]
    pinned = place(targets, arrivals, "completions", "by-client")
    assert pinned == [f"http://r{k}:{k}/v1/completions" for k in (2, 1, 1, 2)]  # a on r1, b on r2
    with pytest.raises(ValueError, match="placement"):
        place(targets, arrivals, "completions", "random")


def test_wait_comes_before_the_admin_api_is_read(fake, monkeypatch, capsys):
    # a gateway just started answers its admin API only once it is up: --wait must come first
    import fairserve.bench.cli as bench_cli
    from fairserve.cli import main

    calls: list[str] = []
    real_preflight = bench_cli.preflight
    monkeypatch.setattr(bench_cli, "preflight", lambda *a, **k: calls.append("wait") or real_preflight(*a, **k))

    def weights_read(*args, **kwargs):
        calls.append("admin")
        raise ValueError("--admin-key: stop here")

    monkeypatch.setattr(bench_cli, "server_weights", weights_read)
    _, url = fake
    argv = ["bench", "--target", url, "--workload", "overload", "--duration", "1", "--keys", "*=k", "--no-progress"]
    assert main([*argv, "--wait", "5", "--admin-key", "adm"]) == 2
    assert calls == ["wait", "admin"] and "stop here" in capsys.readouterr().err


def test_the_plots_label_names_each_target():
    from fairserve.bench.cli import target_label

    assert target_label("http://127.0.0.1:8081,http://127.0.0.1:8082/v1") == "127.0.0.1:8081, 127.0.0.1:8082"
    assert target_label("http://gw:8080") == "gw:8080"
