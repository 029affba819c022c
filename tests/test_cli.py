"""`fairserve simulate` end to end: output, JSON, and one clear error for bad input."""

import json
import subprocess
import sys

import pytest

from fairserve.cli import main

pytestmark = pytest.mark.integration


def test_simulate_prints_table_and_fairness(capsys):
    assert main(["simulate", "--workload", "overload", "--duration", "60", "--policy", "vtc,fcfs"]) == 0
    out = capsys.readouterr().out
    assert "policy vtc" in out and "policy fcfs" in out
    assert out.count("\nclient-0 ") == 2 and "Jain's index" in out and "n/a" not in out and "output tokens/s" in out


def test_json_records(tmp_path):
    out = tmp_path / "run.json"
    assert main(["simulate", "--workload", "overload", "--duration", "60", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["summary"]["policy"] == "vtc"
    reqs = doc["requests"]
    assert len(reqs) == 90 + 180
    fields = {"client", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens", "status"}
    assert fields <= set(reqs[0])
    assert {r["status"] for r in reqs} <= {"finished", "unfinished", "rejected"}
    assert any(r["finish_s"] is None for r in reqs)  # overload: some never finish by 60 s
    assert {r["client"] for r in reqs} == {"client-0", "client-1"}


def test_json_per_policy_files(tmp_path):
    out = tmp_path / "run.json"
    assert (
        main(["simulate", "--workload", "overload", "--duration", "30", "--policy", "fcfs,rpm:5", "--json", str(out)])
        == 0
    )
    assert (tmp_path / "run.fcfs.json").exists() and (tmp_path / "run.rpm-5.json").exists()
    rpm = json.loads((tmp_path / "run.rpm-5.json").read_text())
    assert any(r["status"] == "rejected" for r in rpm["requests"])


def test_trace_and_options(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time_s,client,prompt_tokens,output_tokens\n0,x,10,20\n0.5,y,30,5\n1,x,10,20\n")
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(trace),
                "--policy",
                "vtc",
                "--weights",
                "x=2,y=1",
                "--engine-mode",
                "paged",
                "--kv-tokens",
                "5000",
                "--profile",
                "llama-2-7b@a100-80gb",
                "--drain",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "paged" in out and "5,000" in out and "x " in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workload", "nope"], "unknown workload"),
        (["--trace", "/no/such/file.csv"], "not found"),
        (["--workload", "overload", "--policy", "magic"], "unknown policy"),
        (["--workload", "overload", "--weights", "a"], "bad --weights"),
        (["--workload", "overload", "--profile", "tpu"], "unknown latency model"),
        (["--workload", "overload", "--policy", "rpm:x"], "not a number"),
    ],
)
def test_bad_input_one_clear_line(args, message, capsys):
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fairserve: error:") and message in err[0]


def test_bad_trace_contents(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_time_s,client,prompt_tokens,output_tokens\n0,x,ten,20\n")
    assert main(["simulate", "--trace", str(bad)]) == 2
    assert "bad.csv:2" in capsys.readouterr().err


def test_module_entry_point_and_argparse_errors():
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairserve",
            "simulate",
            "--workload",
            "overload",
            "--duration",
            "20",
            "--policy",
            "fcfs",
        ],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "policy fcfs" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "fairserve", "simulate", "--workload", "overload", "--kv-tokens", "-5"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--kv-tokens" in bad.stderr


def test_a_command_imports_only_its_own_package():
    """`fairserve simulate` and `reproduce` start without the servers' web framework or HTTP client; `--help` and
    an unknown command still list every command."""
    code = (
        "import sys; from fairserve.cli import main; main(sys.argv[1:]); "
        "print(sorted(m for m in ('fastapi', 'httpx', 'uvicorn') if m in sys.modules))"
    )
    for argv in (
        ["simulate", "--workload", "overload", "--duration", "5", "--policy", "fcfs"],
        ["reproduce", "--only", "x"],
    ):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
        assert out.stdout.strip().splitlines()[-1] == "[]", (out.stdout, out.stderr)
    shown = subprocess.run([sys.executable, "-m", "fairserve", "--help"], capture_output=True, text=True).stdout
    wrong = subprocess.run([sys.executable, "-m", "fairserve", "nonsense"], capture_output=True, text=True).stderr
    for command in ("simulate", "reproduce", "emulate", "gateway", "serve", "bench", "sweep", "top"):
        assert command in shown and command in wrong, (command, shown, wrong)


def test_simulate_tree_flags(capsys):
    assert main(["simulate", "--workload", "two-orgs", "--duration", "60", "--weights", "org-a=3"]) == 0
    out = capsys.readouterr().out
    assert "group org-a: service" in out and "group org-b: service" in out
    for flags, message in [
        (["--weights", "org-c=3"], "'org-c' names no tenant or group"),
        (["--priorities", "org-a=x"], "integer PRIORITY"),
        (["--priorities", "org-a=0", "--policy", "fcfs"], "does not order by priority"),
    ]:
        assert main(["simulate", "--workload", "two-orgs", "--duration", "60", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize(
    "argv", [["--nonsense"], ["simulate", "--wrong-flag"], ["bench", "--wrong"], ["top", "--wrong=3"]]
)
def test_an_unknown_option_is_named_first(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    flag = argv[-1].split("=")[0]
    assert f"unrecognized arguments: {flag}" in err, err
    assert "required" not in err


def test_version(capsys):
    from fairserve import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"fairserve {__version__}"
    assert __version__[0].isdigit()


@pytest.mark.parametrize(
    "argv",
    [
        ["emulate", "--listen", "127.0.0.1:{port}"],
        ["gateway", "--backend", "http://127.0.0.1:9", "--tenant", "a:key-a", "--listen", "127.0.0.1:{port}"],
    ],
)
def test_a_port_in_use_is_one_line(argv, capsys):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main([a.format(port=port) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fairserve: error: cannot listen on 127.0.0.1:{port}: the address is already in use"], err
