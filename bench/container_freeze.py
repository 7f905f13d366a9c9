"""A host frozen, then thawed, with the run's tasks in containers: from the SIGSTOP of every
process of the workers' host (its supervisor, monitors, conmons or containerd-shims, and the
containers' processes) to the run's verdict, then from the thaw until no container or process
of the run is left on that host; `down` afterwards must find nothing anywhere. Root is needed
(the simulated hosts of `bench/netns_hosts.py`, each with its own podman and dockerd). From the
repo root:

    python -m bench.container_freeze                       # podman and docker, both modes, once
    python -m bench.container_freeze --runtime docker --mode spare --repeat 3

Modes: `attached` (an attached `up`: the run fails after host_timeout; thawed, the host's
monitors find their lease run out and stop their containers), `spare` (a detached run with a
spare: the workers move to it; thawed, the watcher has the host stop the tasks it still had,
containers and all: a detached run holds no lease) and `detached` (a detached run: it fails after
host_timeout; a detached run holds no lease, so the thawed host's tasks run until `down`, timed
from the thaw, stops them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.containers_lab import (
    IMAGE,
    HostDockerLab,
    HostPodmanLab,
    Lab,
    build_rootfs,
    freeze,
    host_tree,
    run_processes,
    thaw,
)
from bench.netns_hosts import TestHostLab
from bench.waiting import wait_until
from tfctl.supervisor import containers

FAKE_TASK = Path(__file__).resolve().parents[1] / "tests" / "tasks" / "fake_task.py"
MODES = ["attached", "spare", "detached"]
FROZEN = "tfh1"  # the workers' host; tfh0 runs the ps, tfh2 is the spare


def write_cluster(folder: Path, lab: TestHostLab, runtime: str, host_timeout: float, spare: bool) -> Path:
    task = f"{{python}} {FAKE_TASK} --tick 0.05 --lines 0"
    path = folder / "cluster.yaml"
    path.write_text(f"""name: cf
workdir: {folder}
python: {sys.executable}
grace_period: 1
startup_timeout: 60
lease_timeout: 2
host_timeout: {host_timeout:g}
ssh: {{config: {lab.ssh_config}, connect_timeout: 10, keepalive: 1}}
{"spares: [tfh2]" if spare else ""}
container: {{image: {IMAGE}, runtime: {runtime}, mounts: ["{FAKE_TASK.parent}:{FAKE_TASK.parent}:ro"]}}
jobs:
  ps:
    hosts: [tfh0:2222]
    command: "{task} --name ps --port 2222 --sleep -1"
  worker:
    hosts: [{FROZEN}:2222, {FROZEN}:2223]
    command: "{task} --name w{{task_index}} --port -1 --sleep -1"
""")
    return path


def tfctl(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TFCTL_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "tfctl", *args], env=env, capture_output=True, text=True, timeout=180)


def containers_of(runtimes: dict[str, Lab], run_id: str, but: str = "") -> dict[str, list[str]]:
    """The run's containers on each host (but one: a frozen host's dockerd answers nothing)."""
    label = f"{containers.RUN_LABEL}={run_id}"
    return {host: found for host, lab in runtimes.items() if host != but and (found := lab.containers(label))}


def one_cycle(lab: TestHostLab, runtimes: dict[str, Lab], folder: Path, mode: str, host_timeout: float) -> list[str]:
    """One freeze and thaw: [seconds to the verdict, seconds from the thaw until the host kept
    nothing of the run, what `down` said (the one right after the thaw, if any)]."""
    home = folder / "home"
    cluster = write_cluster(folder, lab, next(iter(runtimes.values())).name, host_timeout, mode == "spare")
    up = None
    if mode != "attached":
        started = tfctl(home, "-f", str(cluster), "up", "-d")
        if started.returncode:
            raise SystemExit(started.stderr)
    else:
        up = subprocess.Popen(
            [sys.executable, "-m", "tfctl", "-f", str(cluster), "up"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TFCTL_HOME": str(home)},
        )
        assert up.stderr is not None
        if not any("following" in line for line in up.stderr):
            raise SystemExit(f"`up` ended before its tasks ran (exit code {up.wait()})")
    run_id = json.loads(tfctl(home, "runs", "--json").stdout)[-1]["run_id"]
    frozen: set[int] = set()
    try:
        wait_until(lambda: sum(map(len, containers_of(runtimes, run_id).values())) == 3, 30, "3 containers")
        froze = time.monotonic()
        frozen = freeze(lab.host(FROZEN))
        if up is not None:
            up.communicate(timeout=host_timeout + 60)
            if up.returncode != 1:
                raise SystemExit(f"`up` ended with {up.returncode}, not 1")
        elif mode == "detached":
            record = home / "runs" / run_id / "run.json"
            failed = lambda: json.loads(record.read_text())["state"] == "failed"  # noqa: E731
            wait_until(failed, host_timeout + 60, "the run failed")
        else:
            moved = lambda: len(containers_of(runtimes, run_id, but=FROZEN).get("tfh2", [])) == 2  # noqa: E731
            wait_until(moved, 60, "the workers moved")
        verdict = time.monotonic() - froze
        kept = set(run_processes(run_id)) & frozen
        if not kept:
            raise SystemExit(f"{FROZEN} kept no process of the run while frozen")
    finally:
        thaw(frozen)
        if up is not None and up.poll() is None:
            up.kill()
            up.wait()
    thawed = time.monotonic()
    said = ""  # what a `down` right after the thaw said
    if mode == "detached":
        down = tfctl(home, "-f", str(cluster), "down", "--run", run_id)
        said = down.stderr.strip().splitlines()[-1]
        if down.returncode or "2 containers stopped" not in said:
            raise SystemExit(f"down after the thaw: {down.stderr}")

    def left_on_frozen() -> tuple[list[str], list[int]]:
        return containers_of(runtimes, run_id).get(FROZEN, []), sorted(
            set(run_processes(run_id)) & set(host_tree(lab.host(FROZEN)))
        )

    wait_until(left_on_frozen, 60, f"{FROZEN} keeping nothing of the run", until=lambda left: left == ([], []))
    gone = time.monotonic() - thawed
    down = tfctl(home, "-f", str(cluster), "down", "--run", run_id)
    proof = said or down.stderr.strip().splitlines()[-1]
    if down.returncode or "0 remain" not in down.stderr or containers_of(runtimes, run_id) or run_processes(run_id):
        raise SystemExit(f"{run_id} left something: {down.stderr}")
    return [f"{verdict:.1f}", f"{gone:.1f}", proof]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", nargs="+", choices=["podman", "docker"], default=["podman", "docker"])
    parser.add_argument("--mode", nargs="+", choices=MODES, default=MODES)
    parser.add_argument("--host-timeout", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=1)
    options = parser.parse_args()
    kinds = {"podman": HostPodmanLab, "docker": HostDockerLab}
    rows = []
    with tempfile.TemporaryDirectory(prefix="tfctl-cf-") as scratch:
        base = Path(scratch)
        rootfs = base / "rootfs.tar"
        build_rootfs(rootfs)
        env = {**HostPodmanLab.session_env(base / "podman"), **HostDockerLab.session_env(base / "docker")}
        with TestHostLab(
            3, workdir=base / "lab", prefix="tfctl-cf", bridge="tfctlbr72", subnet="10.77.72", session_env=env
        ) as lab:
            for name in options.runtime:
                runtimes: dict[str, Lab] = {h.name: kinds[name](base / name, h) for h in lab.hosts}
                try:
                    began = time.monotonic()
                    for runtime in runtimes.values():
                        runtime.start(rootfs)
                    print(f"{name} on {len(runtimes)} hosts, with the image: {time.monotonic() - began:.1f}s")
                    for mode in options.mode:
                        for number in range(options.repeat):
                            folder = base / f"{name}-{mode}-{number}"
                            folder.mkdir()
                            rows.append([name, mode, *one_cycle(lab, runtimes, folder, mode, options.host_timeout)])
                            print(" | ".join(rows[-1]), flush=True)
                finally:
                    for runtime in runtimes.values():
                        runtime.tear_down()
    print(f"host_timeout {options.host_timeout:g} s, lease_timeout 2 s")
    print("runtime | mode | s from freeze to verdict | s from thaw to nothing left there | down")
    for row in rows:
        print(" | ".join(row))


if __name__ == "__main__":
    main()
