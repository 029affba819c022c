"""Trace loaders: fairserve CSV/JSONL, Azure, BurstGPT, Mooncake; client assignment; errors."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.workloads import Arrival, WorkloadError, load_trace
from fairserve.workloads.real import PACKAGED_ARENA_TRACE
from fairserve.workloads.traces import assign_clients

pytestmark = pytest.mark.unit

FAIRSERVE_HEADER = "arrival_time_s,client,prompt_tokens,output_tokens\n"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_fairserve_csv_sorted_stably(tmp_path):
    path = write(
        tmp_path, "mini.csv", FAIRSERVE_HEADER + "2.5,b,10,20\n0.000000,client-13,13,199\n2.5,a,1,1\n1,b,3,4\n"
    )
    w = load_trace(path)
    assert w.name == "mini" and w.duration_s == 2.5
    assert w.arrivals == [
        Arrival(0.0, "client-13", 13, 199),
        Arrival(1.0, "b", 3, 4),
        Arrival(2.5, "b", 10, 20),
        Arrival(2.5, "a", 1, 1),
    ]
    assert (w.weights, w.kv_tokens, w.latency_profile) == (None, None, None)


def test_fairserve_jsonl_and_options(tmp_path):
    rows = [
        {"arrival_time_s": t, "client": c, "prompt_tokens": 5, "output_tokens": 7}
        for t, c in [(4.0, "x"), (0.0, "y"), (2.0, "x"), (6.0, "z")]
    ]
    path = write(tmp_path, "j.jsonl", jsonl(rows))
    w = load_trace(path, clients=3, seed=9)  # clients ignored: the trace has client ids
    assert [(a.arrival_s, a.client) for a in w.arrivals] == [(0.0, "y"), (2.0, "x"), (4.0, "x"), (6.0, "z")]
    w = load_trace(path, "fairserve", limit=2, time_scale=2.0)
    assert [(a.arrival_s, a.client) for a in w.arrivals] == [(0.0, "y"), (1.0, "x")] and w.duration_s == 1.0


def test_azure_datetimes_with_seven_fraction_digits(tmp_path):
    path = write(
        tmp_path,
        "AzureLLMInferenceTrace_conv.csv",
        AZURE_HEADER
        + "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
        + "2023-11-16 18:16:00.0000000,0,10\n2023-11-17 00:00:00.1,100,0\n2023-11-16 18:15:47,5,6\n"
        + "2023-11-16 18:15:45.6805900,0,1\n",
    )  # dropped, but still the time origin
    w = load_trace(path)
    assert [a.arrival_s for a in w.arrivals] == pytest.approx([1.0, 1.31941, 5.314579], abs=1e-9)
    assert [(a.prompt_tokens, a.output_tokens) for a in w.arrivals] == [(374, 44), (5, 6), (396, 109)]
    assert all(a.client.startswith("client-") for a in w.arrivals)
    tz = write(tmp_path, "tz.csv", AZURE_HEADER + "2024-05-10 00:00:01.5+00:00,1,1\n2024-05-10T02:00:00.5+02:00,1,1\n")
    assert [a.arrival_s for a in load_trace(tz, "azure").arrivals] == [0.0, 1.0]


def test_burstgpt_drops_failures(tmp_path):
    path = write(
        tmp_path,
        "BurstGPT_1.csv",
        BURST_HEADER
        + "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,0,1087,Conversation log\n"
        + "1,ChatGPT,10,20,30,API log\n",
    )
    w = load_trace(path)
    assert [(a.arrival_s, a.prompt_tokens, a.output_tokens) for a in w.arrivals] == [(1.0, 10, 20), (5.0, 472, 18)]
    assert w.duration_s == 5.0
    only_failures = write(tmp_path, "fail.csv", BURST_HEADER + "45,GPT-4,1087,0,1087,Conversation log\n")
    with pytest.raises(WorkloadError, match="no requests .1 rows dropped"):
        load_trace(only_failures)


def test_mooncake_milliseconds(tmp_path):
    rows = [
        {"timestamp": 3000, "input_length": 6955, "output_length": 52, "hash_ids": [1, 2]},
        {"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": []},
    ]
    w = load_trace(write(tmp_path, "mooncake_trace.jsonl", jsonl(rows)))
    assert [(a.arrival_s, a.prompt_tokens, a.output_tokens) for a in w.arrivals] == [(0.0, 100, 10), (3.0, 6955, 52)]


def test_prefixes_from_fairserve_columns_and_mooncake_hash_ids(tmp_path):
    csv_text = "arrival_time_s,client,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
    csv_text += "0,a,300,5,sys-a,200\n1,b,50,5,,\n2,a,700,5,sys-a,700\n"
    w = load_trace(write(tmp_path, "p.csv", csv_text))
    assert [a.prefix for a in w.arrivals] == [(("sys-a", 200),), (), (("sys-a", 700),)]
    rows = [{"arrival_time_s": 0, "client": "c", "prompt_tokens": 9, "output_tokens": 1, "prefix_id": "d"}]
    rows[0]["prefix_tokens"] = 4
    assert load_trace(write(tmp_path, "p.jsonl", jsonl(rows))).arrivals[0].prefix == (("d", 4),)
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [7, 8, 9]},
        {"timestamp": 1, "input_length": 1000, "output_length": 1, "hash_ids": [7, 8, 9]},  # a longer list: cut
    ]
    w = load_trace(write(tmp_path, "m.jsonl", jsonl(rows)))
    assert [a.prefix for a in w.arrivals] == [(("7", 512), ("8", 512), ("9", 76)), (("7", 512), ("8", 488))]


@pytest.mark.parametrize(
    "row, message",
    [
        ("0,a,10,1,sys,\n", "p.csv:2: prefix_id and prefix_tokens go together"),
        ("0,a,10,1,sys,11\n", r"p.csv:2: prefix_tokens must be between 1 and prompt_tokens \(10\), got 11"),
        ("0,a,10,1,sys,x\n", "p.csv:2: prefix_tokens"),
    ],
)
def test_bad_prefix_columns_name_file_and_line(tmp_path, row, message):
    header = "arrival_time_s,client,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
    with pytest.raises(WorkloadError, match=message):
        load_trace(write(tmp_path, "p.csv", header + row))
    bad = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "x"]}
    with pytest.raises(WorkloadError, match="m.jsonl:1: hash_ids must be a list of integers"):
        load_trace(write(tmp_path, "m.jsonl", jsonl([bad])))


def test_auto_detects_by_content_for_other_extensions(tmp_path):
    rows = [{"timestamp": 10, "input_length": 1, "output_length": 1}]
    assert load_trace(write(tmp_path, "t.txt", jsonl(rows))).arrivals[0].arrival_s == 0.01
    assert load_trace(write(tmp_path, "f.log", FAIRSERVE_HEADER + "1,c,2,3\n")).arrivals == [Arrival(1.0, "c", 2, 3)]


def burst_rows(n: int) -> str:
    return BURST_HEADER + "".join(f"{i * 0.5},ChatGPT,{i + 1},{i + 2},0,API log\n" for i in range(n))


def test_client_assignment_is_seeded_and_skewed(tmp_path):
    path = write(tmp_path, "b.csv", burst_rows(4000))
    a, b = load_trace(path, seed=1), load_trace(path, seed=1)
    assert a == b
    assert [x.client for x in a.arrivals] != [x.client for x in load_trace(path, seed=2).arrivals]
    freq = Counter(x.client for x in a.arrivals)
    assert set(freq) == {f"client-{i}" for i in range(8)}  # default 8 clients
    share = [freq[f"client-{i}"] / 4000 for i in range(8)]
    harmonic = sum(1 / (i + 1) for i in range(8))
    assert share == pytest.approx([1 / (i + 1) / harmonic for i in range(8)], abs=0.025)
    assert {x.client for x in load_trace(path, clients=3).arrivals} == {"client-0", "client-1", "client-2"}
    # a prefix keeps its clients; time_scale divides times
    head = load_trace(path, seed=1, limit=100, time_scale=2.0)
    assert [x.client for x in head.arrivals] == [x.client for x in a.arrivals[:100]]
    assert head.arrivals[-1].arrival_s == 99 * 0.5 / 2 == head.duration_s
    assert assign_clients(5, 1, 0) == ["client-0"] * 5


@pytest.mark.parametrize(
    "name, text, fmt, message",
    [
        ("e.csv", "", "auto", "e.csv: trace file is empty"),
        ("h.csv", "a,b,c\n1,2,3\n", "auto", r"h.csv:1: cannot tell the trace format"),
        ("m.csv", "arrival_time_s,client,prompt_tokens\n", "fairserve", r"m.csv:1: .*missing columns 'output_tokens'"),
        ("n.csv", FAIRSERVE_HEADER + "0,a,1,1\n\n1.5,a,x,1\n", "auto", r"n.csv:4: prompt_tokens is not a number: 'x'"),
        ("f.csv", FAIRSERVE_HEADER + "0,a,1.5,1\n", "auto", r"f.csv:2: prompt_tokens is not a whole number"),
        ("t.csv", FAIRSERVE_HEADER + "0,a,1,1\n-1,a,1,1\n", "auto", r"t.csv:3: arrival_time_s is negative"),
        ("z.csv", FAIRSERVE_HEADER + "0,a,0,1\n", "auto", r"z.csv:2: prompt_tokens and output_tokens must be >= 1"),
        ("c.csv", FAIRSERVE_HEADER + "0,a,1\n", "auto", r"c.csv:2: expected 4 columns"),
        ("k.csv", FAIRSERVE_HEADER + "0, ,1,1\n", "auto", r"k.csv:2: client is empty"),
        ("i.csv", FAIRSERVE_HEADER + "inf,a,1,1\n", "auto", r"i.csv:2: .*not a finite number"),
        ("o.csv", FAIRSERVE_HEADER, "auto", r"o.csv: trace has no requests"),
        (
            "a.csv",
            AZURE_HEADER + "2023-11-16 18:15:46.68,1,1\nyesterday,1,1\n",
            "auto",
            r"a.csv:3: TIMESTAMP is not a date-time",
        ),
        ("d.csv", AZURE_HEADER + "2023-02-30 00:00:00,1,1\n", "azure", r"d.csv:2: TIMESTAMP is not a date-time"),
        (
            "j.jsonl",
            '{"timestamp": 1, "input_length": 1, "output_length": 1}\n{oops\n',
            "auto",
            r"j.jsonl:2: invalid JSON",
        ),
        (
            "l.jsonl",
            '{"timestamp": 1, "input_length": 1, "output_length": 1}\n[1]\n',
            "auto",
            r"l.jsonl:2: expected a JSON object",
        ),
        (
            "q.jsonl",
            '{"timestamp": 1, "input_length": 1, "output_length": 1}\n{"timestamp": 2}\n',
            "auto",
            r"q.jsonl:2: missing key",
        ),
        ("r.jsonl", '{"foo": 1}\n', "auto", r"r.jsonl:1: cannot tell the trace format from the keys"),
        ("s.jsonl", '{"timestamp": 1}\n', "azure", r"s.jsonl: azure traces are not stored as JSONL"),
        ("u.csv", FAIRSERVE_HEADER + "0,a,1,1\n", "mooncake", r"u.csv: mooncake traces are not stored as CSV"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path, name, text, fmt, message):
    with pytest.raises(WorkloadError, match=message):
        load_trace(write(tmp_path, name, text), fmt)


def test_missing_file_and_bad_options(tmp_path):
    with pytest.raises(WorkloadError, match="nope.csv: trace file not found"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(WorkloadError, match="is a directory"):
        load_trace(tmp_path)
    path = write(tmp_path, "ok.csv", FAIRSERVE_HEADER + "0,a,1,1\n")
    with pytest.raises(WorkloadError, match="unknown trace format 'parquet'.*burstgpt.*mooncake"):
        load_trace(path, "parquet")
    for kwargs, what in [
        ({"clients": 0}, "clients"),
        ({"limit": 0}, "limit"),
        ({"time_scale": 0.0}, "time_scale"),
        ({"time_scale": float("nan")}, "time_scale"),
    ]:
        with pytest.raises(WorkloadError, match=what):
            load_trace(path, **kwargs)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from("abc"), st.integers(1, 9999), st.integers(1, 9999)),
        min_size=1,
        max_size=30,
    )
)
def test_fairserve_csv_round_trip(rows):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "rt.csv"
        path.write_text(FAIRSERVE_HEADER + "".join(f"{t / 1000:.3f},client-{c},{p},{o}\n" for t, c, p, o in rows))
        w = load_trace(path)
    expected = sorted(((t / 1000, f"client-{c}", p, o) for t, c, p, o in rows), key=lambda r: r[0])
    assert [(a.arrival_s, a.client, a.prompt_tokens, a.output_tokens) for a in w.arrivals] == expected
    assert w.duration_s == expected[-1][0]


def test_real_arena_trace():
    w = load_trace(PACKAGED_ARENA_TRACE)  # the copy fairserve ships (NOTICE)
    assert w.name == "arena_27clients_10min"
    assert len(w.arrivals) == 1500 and len({a.client for a in w.arrivals}) == 27
    assert w.arrivals[0] == Arrival(0.0, "client-13", 13, 199)
    assert 0 < w.duration_s <= 600
