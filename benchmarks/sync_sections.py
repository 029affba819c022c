"""Where one sync's time goes inside Redis: the sync script (`SYNC_LUA`) cut after each of its sections, every cut a
script of its own that returns there, run in one Redis (a local redis-server this script starts and stops) against
the same keyspace and interleaved block by block, so that each section's time is the difference between two cuts.

Each cut has its own simulated replicas (the load benchmark's: 10 tenants charged per sync, a backlog that moves, two
backends), so that one cut's batch numbers never make another's charges look applied; the whole script keeps the
state moving. A block is one sync of each of a cut's replicas; Redis's time per sync is `INFO commandstats`'s
(wall time inside Redis: the script and its answer); medians over blocks, the cuts in a new random order each round.
The commands the whole script calls, per sync, come from the same statistics.

`--base DIR` (a checkout of another commit, e.g. `git worktree add /tmp/base HEAD`) runs that checkout's script too,
cut at the same places, interleaved with this one's in the same Redis (its ARGV must be laid out as this one's), and
prints the two side by side: medians and their ratio.

Run: .venv/bin/python benchmarks/sync_sections.py [--tenants 10000] [--replicas 10] [--rounds 200] [--base DIR]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from redis_load import SimReplica, seed  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402

from fairserve.api.server import free_port  # noqa: E402
from fairserve.gateway.shared.scripts import SYNC_LUA  # noqa: E402

# (section, the lines it ends before): each cut returns at the start of the first of them the script has (an older
# script's line where it differs)
CUTS = (
    ("reading ARGV", ("local t = redis.call('TIME')",)),
    ("the clock, the change numbers, the replicas alive, the batch number", ("-- the charges, a few commands",)),
    ("the charges", ("-- ARGV section: weights", "for _ = 1, tonumber(nxt()) do\n  local tenant, w = nxt(), nxt()")),
    ("weights, the backlog's changes, the floor written", ("-- the replicas waiting for capacity",)),
    ("the replicas waiting for capacity", ("local leases, released = {}, false",)),
    ("the leases (two backends)", ("-- room given back while others wait",)),
)
WHOLE = "the pull of changes elsewhere, the answer"


def cut(script: str, markers: tuple[str, ...]) -> str:
    at = next(script.index(m) for m in markers if m in script)
    return script[:at] + "do return 1 end\n" + script[at:]


def cuts(script: str) -> dict[str, str]:
    """The script cut after each section, and whole."""
    return {name: cut(script, markers) for name, markers in CUTS} | {WHOLE: script}


def base_script(checkout: str) -> str:
    """The sync script of another checkout (its src/ imported in a process of its own)."""
    src = str(Path(checkout).resolve() / "src")
    code = "import sys; from fairserve.gateway.shared.scripts import SYNC_LUA; sys.stdout.write(SYNC_LUA)"
    return subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": src}, capture_output=True, text=True, check=True
    ).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", type=int, default=10_000)
    ap.add_argument("--replicas", type=int, default=10, help="simulated replicas per cut (a block's syncs)")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--base", help="a checkout whose script runs side by side with this one's")
    a = ap.parse_args()
    if min(a.tenants, a.replicas, a.rounds) < 1 or a.tenants < 10:
        ap.error("--tenants must be >= 10, --replicas and --rounds >= 1")
    binary = shutil.which("redis-server")
    if binary is None:
        print("sync_sections.py: redis-server is not installed (scripts/setup-redis.sh installs it)", file=sys.stderr)
        return 1
    import redis

    scripts = cuts(SYNC_LUA)
    sections = list(scripts)
    if a.base:
        scripts |= {f"base: {name}": text for name, text in cuts(base_script(a.base)).items()}
    names = list(scripts)
    whole = [name for name in names if name.endswith(WHOLE)]
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(binary, free_port(), tmp)
        server.start()
        try:
            seed(server.url, a.tenants)
            client = redis.Redis.from_url(server.url)
            shas = {name: client.script_load(src) for name, src in scripts.items()}
            tenants = [f"t{i}" for i in range(a.tenants)]
            sims = {
                name: [SimReplica(f"c{k}-{j}", tenants, 10, hash((k, j))) for j in range(a.replicas)]
                for k, name in enumerate(names)
            }
            for group in sims.values():  # NOTE: a replica's first sync reads every tenant: not what is measured
                for sim in group:
                    sim.answered(client.evalsha(shas[whole[0]], 0, *sim.args()))
            per_sync: dict[str, list[float]] = {name: [] for name in names}
            commands: dict[str, list[int]] = {}
            for _ in range(a.rounds):
                for name in random.sample(names, len(names)):
                    syncs = [sim.args() for sim in sims[name]]
                    client.config_resetstat()
                    for sim, args in zip(sims[name], syncs, strict=True):
                        reply = client.evalsha(shas[name], 0, *args)
                        if name in whole:
                            sim.answered(reply)
                    stats = client.info("commandstats")
                    per_sync[name].append(stats["cmdstat_evalsha"]["usec"] / stats["cmdstat_evalsha"]["calls"])
                    if name == WHOLE:
                        for cmd, s in stats.items():
                            if cmd != "cmdstat_evalsha" and not cmd.startswith("cmdstat_config"):
                                commands.setdefault(cmd[8:].upper(), []).append(s["calls"])
            client.close()
        finally:
            server.stop()
    print(
        f"One sync inside Redis, cut after each section ({a.tenants:,} tenants, 10 charged per sync, medians of "
        f"{a.rounds} blocks of {a.replicas} syncs, INFO commandstats)\n"
    )
    med = {name: statistics.median(times) for name, times in per_sync.items()}
    if a.base:
        print(f"(base: {a.base})\n")
        print("| up to the end of | µs per sync | the section | base: µs per sync | the section | ratio |")
        print("|---|---:|---:|---:|---:|---:|")
    else:
        print("| up to the end of | µs per sync | the section |\n|---|---:|---:|")
    before = base_before = 0.0
    for name in sections:
        at = med[name]
        row = f"| {name} | {at:.1f} | {at - before:+.1f} |"
        if a.base:
            b = med[f"base: {name}"]
            row += f" {b:.1f} | {b - base_before:+.1f} | {at / b:.3f} |"
            base_before = b
        print(row)
        before = at
    calls = {cmd: statistics.mean(n) / a.replicas for cmd, n in commands.items()}
    shown = ", ".join(f"{cmd} {n:.2f}" for cmd, n in sorted(calls.items(), key=lambda c: -c[1]))
    print(f"\nthe whole script's commands per sync: {sum(calls.values()):.1f} ({shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
