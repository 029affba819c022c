"""The command line's edges a new user meets: hints that name the real flags, complete lists, help that reads as
printed, the README's own-trace example finishing its requests, Jain's index on a short run; and start-up that
imports nothing it does not need."""

import json
import re
import sys
from pathlib import Path

import pytest

from fairserve.cli import SUMMARIES, build_parser, main
from fairserve.core import check_policy
from fairserve.workloads import ALL_WORKLOADS

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_prefix_cache_hint_names_the_real_flag():
    with pytest.raises(ValueError) as e:
        check_policy("lpm")
    assert "--engine-mode paged --prefix-cache" in str(e.value) and "--mode paged" not in str(e.value)


def test_an_unknown_workload_lists_every_workload(capsys):
    assert main(["simulate", "--workload", "nosuch"]) == 2
    err = capsys.readouterr().err
    listed = err.split("valid names: ", 1)[1].strip().split(", ")
    assert listed == list(ALL_WORKLOADS) and len(listed) >= 28


@pytest.mark.parametrize("argv", [["simulate", "--bogus"], ["bogus"], ["gateway", "--nope"]])
def test_the_usage_line_lists_every_command(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "{" + ",".join(SUMMARIES) + "}" in err.replace("\n", "").replace(" ", "")


def test_each_command_says_in_its_parser_what_the_outline_says():
    full = build_parser()
    sub = full._subparsers._group_actions[0]  # noqa: SLF001
    helps = {a.dest: a.help for a in sub._choices_actions}  # noqa: SLF001
    assert helps == SUMMARIES


def test_sweep_help_prints_a_plain_percent(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert "95% confidence" in " ".join(out.split()) and "%%" not in out


HEAVY = ("fairserve.sim", "fairserve.core", "fairserve.workloads", "fairserve.metrics")  # numpy comes with them


def test_version_and_help_import_neither_numpy_nor_the_simulator(capsys, monkeypatch):
    for name in [m for m in sys.modules if m.startswith(HEAVY)]:
        monkeypatch.delitem(sys.modules, name)  # NOTE: put back after the test
    for argv in (["--version"], ["--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    out = capsys.readouterr().out
    assert re.search(r"^fairserve \S+$", out, re.M) and "simulate" in out
    assert not [m for m in sys.modules if m.startswith(HEAVY)]


def test_the_readmes_own_trace_example_finishes_its_requests(tmp_path, monkeypatch, capsys):
    lines = README.read_text().splitlines()
    printf = next(line for line in lines if line.startswith("printf ") and "my.csv" in line)
    command = next(line for line in lines if line.startswith("fairserve simulate --trace my.csv"))
    csv = printf.split("'")[1].encode().decode("unicode_escape")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.csv").write_text(csv)
    argv = command.split("#")[0].split()[1:]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert [r["status"] for r in doc["requests"]] == ["finished", "finished"]


def test_jains_index_on_a_run_shorter_than_a_window(capsys):
    """The README's system-prompts line: 30 s, all 8 clients backlogged; a 60 s window does not fit in it."""
    argv = ["simulate", "--workload", "system-prompts", "--engine-mode", "paged", "--prefix-cache"]
    assert main([*argv, "--kv-tokens", "4384", "--duration", "30", "--policy", "vtc"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Jain's index"))
    assert "7.5 s windows" in line and "n/a" not in line and float(line.rsplit(" ", 1)[1]) > 0.5
