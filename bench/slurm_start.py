"""Time from `tfctl up -d` to every task running: on Slurm beside the same hosts over ssh.

One lab (bench/slurm_lab.py): three simulated hosts, each with its sshd and a slurmd, slurmctld
on this machine. The same three tasks (a ps that serves, two workers) start on the same hosts in
turn through each backend (and on Slurm both ways: each task's srun on this machine, `slurm`, and
the controller in the allocation's batch script, `slurm-batch`), `--attempts` times each,
alternating so that all see the same machine; `down` after each start. Slurm's figures include
asking for and being granted the allocation; ssh's includes connecting. Prints a table (median
and spread) and, with --json, the samples.

    sudo python -m bench.slurm_start --attempts 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.slurm_lab import SlurmLab

REPO = Path(__file__).resolve().parent.parent
FAKE_TASK = REPO / "tests" / "tasks" / "fake_task.py"
BACKENDS = ("ssh", "slurm", "slurm-batch")
TASKS = {
    "ps": f"{{python}} {FAKE_TASK} --name ps --port -1 --sleep -1",
    "worker": f"{{python}} {FAKE_TASK} --name w{{task_index}} --port -1 --sleep 600",
}


def cluster_file(backend: str, lab: SlurmLab, work: Path) -> Path:
    hosts = [h.name for h in lab.hosts]
    if backend.startswith("slurm"):
        jobs = f"""  ps: {{count: 1, port: 2222, command: "{TASKS["ps"]}"}}
  worker: {{count: 2, port: 2222, command: "{TASKS["worker"]}"}}"""
        head = "backend: slurm\nslurm: {controller: %s}" % ("allocation" if backend == "slurm-batch" else "login")
    else:
        jobs = f"""  ps: {{hosts: [{hosts[0]}:2222], command: "{TASKS["ps"]}"}}
  worker: {{hosts: [{hosts[1]}:2222, {hosts[2]}:2222], command: "{TASKS["worker"]}"}}"""
        head = f"ssh: {{config: {lab.lab.ssh_config}}}\npython: {sys.executable}\nsync: false"
    path = work / backend / "cluster.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"name: start-{backend}\n{head}\ngrace_period: 2\njobs:\n{jobs}\n")
    return path


def timed_up(path: Path, env: dict[str, str]) -> float:
    began = time.monotonic()
    up = subprocess.run(
        [sys.executable, "-m", "tfctl", "-f", str(path), "up", "-d"], env=env, capture_output=True, text=True
    )
    wall = time.monotonic() - began
    if up.returncode != 0:
        raise SystemExit(f"up failed for {path}:\n{up.stderr}")
    down = subprocess.run(
        [sys.executable, "-m", "tfctl", "-f", str(path), "down"], env=env, capture_output=True, text=True
    )
    if down.returncode != 0:
        raise SystemExit(f"down failed for {path}:\n{down.stderr}")
    return wall


def wait_until_no_jobs(lab: SlurmLab, patience: float = 30.0) -> list[str]:
    """The jobs still queued after `patience` s (a batch controller's job ends once its `up` exits)."""
    deadline = time.monotonic() + patience
    while lab.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    return lab.jobs()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfctl-bench-slurm-") as tmp:
        work = Path(tmp)
        with SlurmLab(work / "slurm", prefix="tfctl-bs", bridge="tfctlbr3", subnet="10.77.3") as lab:
            env = {**os.environ, **lab.env(), "TFCTL_HOME": str(work / "home")}
            files = {backend: cluster_file(backend, lab, work) for backend in BACKENDS}
            samples: dict[str, list[float]] = {backend: [] for backend in BACKENDS}
            for _ in range(args.attempts):
                for backend, path in files.items():
                    samples[backend].append(timed_up(path, env))
            if wait_until_no_jobs(lab):
                raise SystemExit(f"jobs left behind: {lab.jobs()}")
    if args.json:
        print(json.dumps(samples))
    ssh_median = statistics.median(samples["ssh"])
    print("backend      up -d to all 3 tasks running (median, min-max)   vs ssh")
    for backend, values in samples.items():
        median = statistics.median(values)
        print(
            f"{backend:<12} {median:5.2f} s ({min(values):.2f}-{max(values):.2f})"
            + " " * 24
            + f"{median / ssh_median:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
