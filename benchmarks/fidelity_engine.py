"""The simulator against the engine in front of it: profile vLLM (its CPU build, the tiny model of the vLLM tier),
run multi-tenant workloads on the real engine with fairserve's scheduler (VTC and FCFS), simulate the same arrivals
from the profile alone, and compare.

1. `fairserve profile --engine vllm` (in a worker process): the engine's step times, its pool and limits, a fitted
   latency model. Nothing below is fitted: every workload is held out.
2. Per policy, one engine (its own worker process, vLLM's engine core in it, async scheduling off as in the
   profile), warmed up on 5 s of the first workload, runs each workload in real time: requests added at their
   arrival times while the engine steps.
3. The simulator runs the same arrivals (`--profile FILE`) in its engine mode `vllm` (vLLM's own steps: the token
   budget, chunked prefill, its preemption; sim/vllm_steps.py), and for comparison in the `paged` mode (a prefill
   pass, then decode steps).
4. A diagnostic (not a prediction: it reads the held-out runs): each real step is timed (from the previous step's
   end while the engine was busy) beside what the profile's model gives for the same step (its prefill chunks, its
   decodes and their context); their ratio is the run's `speed`, how much slower the engine ran than when it was
   profiled, and the simulator runs again with the profile's times scaled by it. What is left is the simulator's
   own error; what the scaling removed was the machine's drift.

Workloads are sized from the profile's capacity C (requests/s of 128 prompt + 64 output tokens at a full batch):
`pair` (two tenants at 0.5C and 1.0C), `on-off` (0.4C steady, 1.2C on 5 s / off 5 s), `weighted` (two at 1.0C each,
weights 1 and 2), `mix` (six tenants, Zipf rates totalling 1.3C, prompts 32–512 and outputs 16–128 tokens).

Per workload and policy: total service rate (service done by the end of the arrivals, w_p = 1, w_q = 2, per
second), the largest per-tenant share error, median and p90 TTFT, median end-to-end latency, each real against
simulated. Targets (issue 49): rate within 5%, shares within 0.02, medians within 15%.

Run (the venv of scripts/vllm_cpu_env.sh):
    PYTHONPATH=src $(scripts/vllm_cpu_env.sh) benchmarks/fidelity_engine.py [--duration 20] [--profile FILE]
        [--save DIR]   the profile and the real runs' requests (real.json), to simulate again without the engine:
        [--real FILE]  (with --profile) compare with these real runs instead of running the engine
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import numpy as np  # noqa: E402
import vllm_cpu_model  # noqa: E402

from fairserve.engines.vllm_scheduler import CLIENT_ARG, SCHEDULER_PATH  # noqa: E402
from fairserve.metrics import service_curves  # noqa: E402
from fairserve.records import RequestRecord  # noqa: E402
from fairserve.sim import SimOptions, simulate  # noqa: E402
from fairserve.sim.engine_profile import load_engine_profile  # noqa: E402
from fairserve.sim.vllm_steps import step_s  # noqa: E402
from fairserve.workloads import Arrival, Workload  # noqa: E402

ENGINE = {"max_num_seqs": 16, "max_model_len": 1024, "dtype": "float32", "enforce_eager": True}
WEIGHTS = {"weighted-b": 2.0}


# ---- workloads ------------------------------------------------------------------------------------------------------
def capacity(profile_path: str) -> float:
    """Requests/s of 128 + 64 tokens the engine finishes at a full batch, by its fitted model."""
    prof = load_engine_profile(profile_path)
    lat, b = prof.latency(), prof.max_num_seqs or 16
    per_batch = lat.prefill_s([128] * b) + sum(lat.decode_step_s(b, b * (128 + k)) for k in range(64))
    return b / per_batch


def paced(client: str, rate: float, duration: float, rng: random.Random, on_off: float | None = None) -> list[Arrival]:
    out, t = [], rng.uniform(0, 1 / rate)
    while t < duration:
        if on_off is None or int(t // on_off) % 2 == 0:
            out.append(Arrival(t, client, 128, 64))
        t += 1 / rate
    return out


def workloads(c: float, duration: float, seed: int) -> dict[str, list[Arrival]]:
    rng = random.Random(seed)
    mix = []
    zipf = [1 / (k + 1) for k in range(6)]
    for k, share in enumerate(zipf):
        rate, t = 1.3 * c * share / sum(zipf), 0.0
        while (t := t + rng.expovariate(rate)) < duration:
            p = int(min(512, max(32, rng.lognormvariate(5.0, 0.7))))
            o = int(min(128, max(16, rng.lognormvariate(3.8, 0.6))))
            mix.append(Arrival(t, f"mix-{k}", p, o))
    return {
        "pair": paced("pair-a", 0.5 * c, duration, rng) + paced("pair-b", 1.0 * c, duration, rng),
        "on-off": paced("onoff-a", 0.4 * c, duration, rng) + paced("onoff-b", 1.2 * c, duration, rng, on_off=5.0),
        "weighted": paced("weighted-a", c, duration, rng) + paced("weighted-b", c, duration, rng),
        "mix": mix,
    }


# ---- the real engine ------------------------------------------------------------------------------------------------
def run_real(llm: Any, arrivals: list[Arrival], tag: str) -> dict[str, Any]:
    """The arrivals in real time on the engine: one record (as a dict) per request, and each engine step as
    [prefill chunks, decodes, their context tokens, seconds] (what the latency model is asked for that step)."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    sched = engine.engine_core.engine_core.scheduler
    steps: list[list[Any]] = []
    schedule = sched.schedule

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = schedule(*args, **kwargs)
        chunks, decodes, context = [], 0, 0
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            before = req.num_computed_tokens - n  # NOTE: schedule() has advanced it already
            if n == 1 and before >= max(req.num_prompt_tokens, req.num_tokens - 1):
                decodes, context = decodes + 1, context + before
            else:
                chunks.append(n)
        steps.append([chunks, decodes, context, 0.0])
        return out

    sched.schedule = recording
    pending = sorted(arrivals, key=lambda a: a.arrival_s)
    recs: dict[str, dict[str, Any]] = {}
    rng = random.Random(hash(tag) & 0xFFFF)
    vocab = int(engine.vllm_config.model_config.get_vocab_size())
    start = time.perf_counter()
    i, last_end = 0, None
    while i < len(pending) or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while i < len(pending) and pending[i].arrival_s <= now:
            a = pending[i]
            rid = f"{tag}-{i}"
            params = SamplingParams(
                max_tokens=a.output_tokens, ignore_eos=True, temperature=0.0, extra_args={CLIENT_ARG: a.client}
            )
            engine.add_request(
                rid, {"prompt_token_ids": [rng.randrange(vocab) for _ in range(a.prompt_tokens)]}, params
            )
            recs[rid] = dict(client=a.client, arrival_s=a.arrival_s, prompt=a.prompt_tokens, max_tokens=a.output_tokens)
            i += 1
        if not engine.has_unfinished_requests():
            last_end = None
            time.sleep(max(0.0, min(0.01, pending[i].arrival_s - now)))
            continue
        before = len(steps)
        t0 = time.perf_counter()
        outs = engine.step()
        t = time.perf_counter() - start
        if len(steps) > before:
            # NOTE: from the previous step's end where the engine was busy since: what the loop spends between steps
            # (adding the requests due, reading outputs) delays the engine as much as the step itself
            steps[-1][3] = time.perf_counter() - (last_end if last_end is not None else t0)
            last_end = time.perf_counter()
        for out in outs:
            r = recs[out.request_id]
            n = len(out.outputs[0].token_ids)
            if n and "first_s" not in r:
                r["first_s"] = t
            r["output"], r["last_s"] = n, t
            if out.finished:
                r["finish_s"] = t
    del sched.schedule
    return {"records": list(recs.values()), "steps": steps}


def engine_worker(policy: str, jobs: list[tuple[str, list[Arrival]]], conn: Any) -> None:
    from vllm import LLM

    os.environ["FAIRSERVE_POLICY"] = policy
    os.environ["FAIRSERVE_WEIGHTS"] = ",".join(f"{t}={w:g}" for t, w in WEIGHTS.items())
    llm = LLM(
        str(vllm_cpu_model.build(vllm_cpu_model.default_dir())),
        seed=0,
        enable_prefix_caching=False,
        async_scheduling=False,
        scheduler_cls=SCHEDULER_PATH,
        **ENGINE,
    )
    # NOTE: warmed up on the first workload's first 5 s, discarded: the first seconds of a new engine run slower
    first = [a for a in jobs[0][1] if a.arrival_s < 5.0]
    run_real(llm, [Arrival(a.arrival_s, "warm-" + a.client, a.prompt_tokens, a.output_tokens) for a in first], "warm")
    # NOTE: the engine profiled as it runs the workloads, its scheduler (fairserve's, this policy) included
    from fairserve.profile import vllm as profiler

    prof = profiler.profile(str(vllm_cpu_model.default_dir()), dict(ENGINE), 3, lambda _: None, llm=llm)
    runs: dict[str, Any] = {name: run_real(llm, arrivals, f"{policy}-{name}") for name, arrivals in jobs}
    conn.send(runs | {"profile": prof.to_dict()})


def profile_worker(path: str, conn: Any) -> None:
    from fairserve.profile import vllm as profiler

    prof = profiler.profile(str(vllm_cpu_model.build(vllm_cpu_model.default_dir())), dict(ENGINE), 3, lambda _: None)
    prof.write(path)
    conn.send("done")


def in_worker(target: Any, *args: Any) -> Any:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child))
    proc.start()
    got = parent.recv()
    proc.join(60)
    return got


# ---- comparison -----------------------------------------------------------------------------------------------------
def to_records(rows: list[dict[str, Any]]) -> list[RequestRecord]:
    out = []
    for k, r in enumerate(rows):
        first = r.get("first_s")
        out.append(
            RequestRecord(
                k,
                r["client"],
                r["arrival_s"],
                first,
                first,
                r.get("finish_s"),
                r.get("last_s"),
                r["prompt"],
                r.get("output", 0),
                r["max_tokens"],
                "finished" if "finish_s" in r else "unfinished",
            )
        )
    return out


def measures(records: list[RequestRecord], end_s: float) -> dict[str, Any]:
    served = {c: float(v[-1]) for c, v in service_curves(records, np.array([0.0, end_s])).items()}
    total = sum(served.values())
    done = [r for r in records if r.finish_s is not None and r.first_token_s is not None]
    ttft = [r.first_token_s - r.arrival_s for r in done]  # type: ignore[operator]
    e2e = [r.finish_s - r.arrival_s for r in done]  # type: ignore[operator]
    return {
        "rate": total / end_s,
        "shares": {c: v / total for c, v in served.items()},
        "ttft_p50": statistics.median(ttft),
        "ttft_p90": float(np.percentile(ttft, 90)),
        "e2e_p50": statistics.median(e2e),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per workload")
    ap.add_argument("--profile", help="a profile file to use instead of measuring one")
    ap.add_argument("--policies", default="vtc,fcfs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="vllm,paged", help="the simulator's engine modes to compare")
    ap.add_argument("--save", metavar="DIR", help="write the profile and the real runs here")
    ap.add_argument("--real", metavar="FILE", help="the real runs of an earlier --save (needs --profile)")
    a = ap.parse_args()
    if a.real and not a.profile:
        ap.error("--real needs the --profile of the same run")

    out = Path(a.save) if a.save else Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    path = a.profile or str(out / "vllm-cpu.json")
    if not a.profile:
        t0 = time.perf_counter()
        in_worker(profile_worker, path)
        print(f"profiled in {time.perf_counter() - t0:.0f} s: {path}")
    c = capacity(path)
    loads = workloads(c, a.duration, a.seed)
    print(f"capacity C = {c:.1f} requests/s of 128 + 64 tokens; {a.duration:g} s of arrivals per workload")
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    if a.real:
        real = json.loads(Path(a.real).read_text())
    else:
        real = {p: in_worker(engine_worker, p, list(loads.items())) for p in policies}
        (out / "real.json").write_text(json.dumps(real))
        print(f"real runs: {out / 'real.json'}")

    lat = load_engine_profile(path).latency()
    speed = {(p, n): step_speed(lat, real[p][n]["steps"]) for p in policies for n in loads}
    print("\nFrom the profile of the engine alone (every workload held out):\n")
    table(loads, policies, real, a.modes.split(","), lambda p, n: path, a.duration)
    own: dict[str, str] = {}
    for p in policies:
        if "profile" in real[p]:
            own[p] = str(out / f"profile-{p}.json")
            Path(own[p]).write_text(json.dumps(real[p]["profile"]))
    if own:
        print(
            "\nFrom each policy's engine profiled as it runs, fairserve's scheduler in it, just before its runs "
            "(held out too):\n"
        )
        table(loads, [p for p in policies if p in own], real, a.modes.split(","), lambda p, n: own[p], a.duration)
    print(
        "\nDiagnostic, not a prediction: each run's steps took x (its `speed`) the time the profile's model gives "
        "the same steps; the simulator again with the profile's times scaled by x:\n"
    )
    table(loads, policies, real, ["vllm"], lambda p, n: scaled(path, speed[(p, n)], out), a.duration, speed)
    print("\nEach run's speed by the kind of step (decode steps only; steps with a prefill chunk):\n")
    for p in policies:
        for n in loads:
            st = real[p][n]["steps"]
            decode, prefill = step_speed(lat, st, "decode"), step_speed(lat, st, "prefill")
            print(f"{n} {p}: decode ×{decode:.2f}, with a prefill chunk ×{prefill:.2f}")


def step_speed(lat: Any, steps: list[list[Any]], kind: str | None = None) -> float:
    """Σ real step seconds ÷ Σ the model's seconds for the same steps; `kind`: of the decode-only steps ("decode")
    or of those with a prefill chunk ("prefill") only."""
    if kind is not None:
        steps = [st for st in steps if bool(st[0]) == (kind == "prefill")]
    predicted = sum(step_s(lat, chunks, decodes, context) for chunks, decodes, context, _ in steps)
    return sum(st[3] for st in steps) / predicted if predicted else float("nan")


def scaled(path: str, x: float, out: Path) -> str:
    """The profile with every measured time × x (its fitted model scales by x)."""
    data = json.loads(Path(path).read_text())
    for row in data["rows"]:
        row["prefill_s"] *= x
        row["decode_step_s"] *= x
    target = out / f"scaled-{x:.4f}.json"
    target.write_text(json.dumps(data))
    return str(target)


def table(
    loads: dict[str, list[Arrival]],
    policies: list[str],
    real: dict[str, Any],
    modes: list[str],
    profile_for: Any,
    duration: float,
    speed: dict[tuple[str, str], float] | None = None,
) -> None:
    print(
        "| workload | policy | mode | speed | rate real | sim | err | max share err | TTFT p50 real | sim | err "
        "| TTFT p90 err | e2e p50 real | sim | err |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, arrivals in loads.items():
        for p in policies:
            r = measures(to_records(real[p][name]["records"]), duration)
            wl = Workload(name, sorted(arrivals, key=lambda x: x.arrival_s), duration)
            x = f"×{speed[(p, name)]:.2f}" if speed else "×1"
            for mode in modes:
                options = SimOptions(policy=p, latency=profile_for(p, name), mode=mode, drain=True)  # type: ignore[arg-type]
                s = measures(simulate(wl, options, weights=WEIGHTS).records, duration)
                share = max(abs(r["shares"][k] - s["shares"].get(k, 0.0)) for k in r["shares"])

                def err(key: str, r: dict = r, s: dict = s) -> str:
                    return f"{s[key] / r[key] - 1:+.1%}"

                print(
                    f"| {name} | {p} | {mode} | {x} | {r['rate']:,.0f} | {s['rate']:,.0f} | {err('rate')} | "
                    f"{share:.3f} | {r['ttft_p50']:.2f} | {s['ttft_p50']:.2f} | {err('ttft_p50')} | "
                    f"{err('ttft_p90')} | {r['e2e_p50']:.2f} | {s['e2e_p50']:.2f} | {err('e2e_p50')} |"
                )


if __name__ == "__main__":
    main()
