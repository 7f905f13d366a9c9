"""A 12-trial sweep against the same 12 runs typed as `up`s in a shell loop, side by side.

Both run the same localhost cluster (a ps and two workers of a small Python task that trains for
`--seconds`) with the same 12 parameter sets (3 learning rates x 2 batch sizes x 2 seeds); the
sweep with `max_parallel: 1`, so it does what the loop does, one run at a time. Rounds alternate
which goes first. Printed: wall time and this machine's CPU (every process both started, reaped
or not, summed from /proc: the commands' own; the tasks' monitors, detached on their host, are
not counted), and the overhead per trial beside the loop's per run.

    python -m bench.sweep                 # 2 rounds
    python -m bench.sweep --rounds 1 --seconds 1
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE_TASK = REPO / "tests" / "tasks" / "fake_task.py"
LRS, BATCHES, SEEDS = (0.1, 0.01, 0.001), (32, 64), (1, 2)
TICK = os.sysconf("SC_CLK_TCK")


def cluster(work: Path, seconds: float) -> Path:
    command = (
        f"{{python}} {FAKE_TASK} --name {{job_name}}{{task_index}} --port -1 --lines 1 --sleep {seconds} "
        "&& echo 'final test accuracy 0.9 after 10 global steps'"
    )
    ps = f"{{python}} {FAKE_TASK} --name ps --port -1 --sleep -1"
    path = work / "cluster.yaml"
    path.write_text(
        f"name: bench\ngrace_period: 2\nparams: {{lr: 0.1, batch: 32, seed: 1}}\n"
        f"command: {json.dumps(command)}\n"
        f"jobs:\n  ps:\n    hosts: [localhost]\n    command: {json.dumps(ps)}\n  worker: [localhost, localhost]\n"
        "sweep: {grid: {lr: [0.1, 0.01, 0.001], batch: [32, 64]}, zip: {seed: [1, 2]}, max_parallel: 1}\n"
    )
    return path


def cpu_of_tree(before: set[int]) -> float:
    """CPU of every process that is not in `before` and still here (the reaped ones are counted
    through the children's times of this process)."""
    total = 0.0
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) not in before:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / TICK
            except OSError:
                continue
    return total


def timed(script: str, home: Path, cwd: Path) -> tuple[float, float]:
    """Wall and CPU of a shell script and everything it started (detached watchers included,
    waited for: a run ends with its watcher)."""
    before = {int(p) for p in os.listdir("/proc") if p.isdigit()}
    used = os.times()
    began = time.monotonic()
    subprocess.run(["bash", "-c", script], cwd=cwd, env={**os.environ, "TFCTL_HOME": str(home)}, check=True)
    wall = time.monotonic() - began
    after = os.times()
    reaped = (after.children_user - used.children_user) + (after.children_system - used.children_system)
    return wall, reaped + cpu_of_tree(before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=2.0, help="how long each trial's workers run")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tfctl-bench-sweep-"))
    path = cluster(work, args.seconds)
    tfctl = f'"{sys.executable}" -m tfctl -f {path}'
    sets = [(lr, b, s) for (lr, b), s in itertools.product(itertools.product(LRS, BATCHES), SEEDS)]
    loop = "; ".join(f"{tfctl} up --set lr={lr} --set batch={b} --set seed={s} >/dev/null" for lr, b, s in sets)
    sweep = f"{tfctl} sweep >/dev/null 2>&1"
    figures: dict[str, list[tuple[float, float]]] = {"sweep": [], "loop": []}
    for round_ in range(args.rounds):
        order = ("sweep", "loop") if round_ % 2 == 0 else ("loop", "sweep")
        for way in order:
            home = work / f"home-{way}-{round_}"
            figures[way].append(timed(sweep if way == "sweep" else loop, home, work))
    print(f"12 runs (a ps and 2 workers, {args.seconds:g} s each), {args.rounds} rounds, medians\n")
    print(f"{'':28}{'sweep':>12}{'12 ups':>12}")
    wall = {w: statistics.median(f[0] for f in figures[w]) for w in figures}
    cpu = {w: statistics.median(f[1] for f in figures[w]) for w in figures}
    print(f"{'wall (s)':28}{wall['sweep']:>12.1f}{wall['loop']:>12.1f}")
    print(f"{'CPU, the commands (s)':28}{cpu['sweep']:>12.1f}{cpu['loop']:>12.1f}")
    print(f"{'wall per run (s)':28}{wall['sweep'] / 12:>12.2f}{wall['loop'] / 12:>12.2f}")
    print(f"\nthe sweep's overhead: {(wall['sweep'] - wall['loop']) / 12:+.2f} s a trial beside a typed `up`")


if __name__ == "__main__":
    main()
