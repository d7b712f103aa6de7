"""The command line's start-up: how long `engram` takes to answer a person typing it, or an
agent shelling out to it, measured as that caller waits: a process from start to exit.

    .venv/bin/python -m bench.bench_cli [--runs 21]

Starts a private redis-server and `engram serve --role all` (the index on, since `search` needs
it; the model loaded and a search answered before timing), saves one note, then runs each
command as a subprocess through the installed `engram` script, ``--runs`` times, interleaved:
`engram --help`, `engram --version`, `engram get` and `engram search` (their human output).
The floor is the same interpreter doing nothing (`python -c pass`). Prints each command's p50
wall time and its ratio to the floor's, against the aims (`--help` 0.3 s, `get` 0.5 s), and one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engram_ledger.services.adapters.redis_server import RedisServer
from tests.support import TEST_MASTER_KEY_B64, ServeProcess, engram_env, wait_until

AIMS_S = {"engram --help": 0.3, "engram get": 0.5}


def engram() -> list[str]:
    """The `engram` a person runs (the script the package installs beside the interpreter)."""
    script = Path(sys.executable).parent / "engram"
    return [str(script)] if script.exists() else [sys.executable, "-m", "engram_ledger.services.cli"]


def run(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, (argv, done.stderr)
    return elapsed


def answers(argv: list[str], env: dict[str, str]) -> bool:
    return subprocess.run(argv, env=env, capture_output=True).returncode == 0


def saved_note(env: dict[str, str]) -> str:
    argv = [*engram(), "save", "--user", "bench", "--subject", "Alec", "--json", "Alec is my boss at TechCorp"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return str(json.loads(done.stdout)["note_id"])


def commands(env: dict[str, str]) -> dict[str, list[str]]:
    note = saved_note(env)
    return {
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
        "engram --help": [*engram(), "--help"],
        "engram --version": [*engram(), "--version"],
        "engram get": [*engram(), "get", "--user", "bench", note],
        "engram search": [*engram(), "search", "--user", "bench", "who is my manager?"],
    }


def measure(env: dict[str, str], runs: int) -> dict[str, list[float]]:
    # The model loads in the background at start: a search answers once it has.
    warm_up = [*engram(), "search", "--user", "bench", "anything"]
    wait_until(lambda: answers(warm_up, env), timeout=120, interval=0.5)
    timed = commands(env)
    times: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(runs):
        for name, argv in timed.items():
            times[name].append(run(argv, env))
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        try:
            env = engram_env(ENGRAM_REDIS_URL=server.url, ENGRAM_DATA_DIR=tmp, ENGRAM_MASTER_KEY=TEST_MASTER_KEY_B64)
            serve = ServeProcess(env).start(timeout=120)
            try:
                times = measure(env, args.runs)
            finally:
                serve.stop()
        finally:
            server.stop()
    p50 = {name: statistics.median(values) for name, values in times.items()}
    floor = p50["python -c pass (floor)"]
    print(f"p50 of {args.runs} runs each, interleaved; wall time of the whole process")
    print(f"{'command':<24} {'p50 ms':>8} {'x floor':>8}  {'aim':>8}")
    for name, seconds in p50.items():
        aim = AIMS_S.get(name)
        verdict = "" if aim is None else ("met" if seconds <= aim else "NOT met")
        print(f"{name:<24} {seconds * 1000:>8.0f} {seconds / floor:>8.1f}  {verdict:>8}")
    print(json.dumps({"runs": args.runs, "p50_s": p50, "times_s": times}))


if __name__ == "__main__":
    main()
