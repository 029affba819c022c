"""How exactly `fairserve profile --engine http` recovers a known engine: it profiles `fairserve emulate` (whose
latency model is the A10G preset with its server overhead) through HTTP and prints, for each decode batch and
prefill shape, the fitted model's error against the emulator's own model. Wall-clock timing: the precision depends
on the machine's load (the load average is printed beside it); the suite's test (tests/test_profile_http.py)
checks only that the profile comes out close.

    .venv/bin/python benchmarks/profile_http.py [--repeats 2] [--batches 1,4,15]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.processes import serve  # noqa: E402

from fairserve.cli import main as fairserve  # noqa: E402
from fairserve.sim.engine_profile import load_engine_profile  # noqa: E402
from fairserve.sim.latency import get_latency_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", default="2")
    ap.add_argument("--batches", default="1,4,15")
    ap.add_argument("--prompts", default="32,256")
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp()) / "emulator.json"
    with serve("emulate", "--engine-mode", "paged") as url:
        argv = ["profile", "--engine", "http", "--url", url, "--kv-tokens", "10000", "--max-num-seqs", "16"]
        argv += ["--prompts", a.prompts, "--batches", a.batches, "--repeats", a.repeats, "--out", str(out)]
        assert fairserve(argv) == 0
    true, fit = get_latency_model("a10g-llama2-7b"), get_latency_model(str(out))
    prompts = sorted({r.prompt_len for r in load_engine_profile(out).rows})
    print(f"\nload average {os.getloadavg()[0]:.1f}; error = fitted / the emulator's model - 1")
    for batch in (1, 4, 16):
        ctx = batch * (prompts[-1] + 8)
        print(
            f"decode step, batch {batch:>2}: {fit.decode_step_s(batch, ctx) / true.decode_step_s(batch, ctx) - 1:+.2%}"
        )
    for p in prompts:
        for batch in (1, 4, 16):
            err = fit.prefill_s([p] * batch) / true.prefill_s([p] * batch) - 1
            print(f"prefill, {p:>4} tokens x {batch:>2}: {err:+.2%}")


if __name__ == "__main__":
    main()
