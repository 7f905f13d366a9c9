"""What a container costs a task: `tfctl up -d` of N stand-in tasks in podman containers beside
the same N tasks bare, and how long `down` takes, and the containers take to go.

Each round starts the bare cluster and the containerised one in turn (the order alternates), a
fresh TFCTL_HOME each, and times `up -d` (which returns once every task runs and the ps listens
and is reached), then `down` and, for the containers, until `podman ps -a` shows none of the run.
Root is needed (the suite's podman lab: `bench/containers_lab.py`).

    python -m bench.containers                  # 8 tasks, 3 rounds
    python -m bench.containers --tasks 8 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.containers_lab import IMAGE, PodmanLab, build_rootfs, skip_reason

REPO = Path(__file__).resolve().parent.parent
FAKE_TASK = REPO / "tests" / "tasks" / "fake_task.py"


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def cluster_file(folder: Path, tasks: int, boxed: bool) -> Path:
    """One ps and `tasks - 1` workers of the stand-in task, listening like TF servers."""
    ports = free_ports(tasks)
    box = f'container: {{image: {IMAGE}, mounts: ["{FAKE_TASK.parent}:{FAKE_TASK.parent}:ro"]}}\n' if boxed else ""
    workers = ", ".join(f"localhost:{p}" for p in ports[1:])
    path = folder / ("boxed.yaml" if boxed else "bare.yaml")
    path.write_text(
        f"name: {'boxed' if boxed else 'bare'}\ngrace_period: 5\nstartup_timeout: 60\n{box}"
        f'command: "{{python}} {FAKE_TASK} --name {{job_name}}{{task_index}} --port -1 --sleep -1"\n'
        f"jobs:\n  ps: [localhost:{ports[0]}]\n  worker: [{workers}]\n"
    )
    return path


def tfctl(home: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tfctl", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TFCTL_HOME": str(home)},
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tfctl {' '.join(args)} failed:\n{done.stderr}")
    return time.monotonic() - began, done


def cycle(lab: PodmanLab, work: Path, tasks: int, boxed: bool) -> dict[str, float]:
    """One `up -d` and `down` of the cluster; seconds of each, and until no container was left."""
    home = Path(tempfile.mkdtemp(dir=work, prefix="home-"))
    cluster = cluster_file(home, tasks, boxed)
    up, started = tfctl(home, "-f", str(cluster), "up", "-d")
    run = started.stdout.strip()
    began = time.monotonic()
    down, _ = tfctl(home, "-f", str(cluster), "down")
    timings = {"up -d": up, "down": down}
    if boxed:
        while lab.containers(f"tfctl.run={run}"):
            time.sleep(0.05)
        timings["containers gone"] = time.monotonic() - began
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    reason = skip_reason("podman")
    if reason is not None:
        sys.exit(f"cannot run: {reason}")
    with tempfile.TemporaryDirectory(prefix="tfctl-bench-containers-") as scratch:
        work = Path(scratch)
        lab = PodmanLab(work / "podman")
        tarball = work / "rootfs.tar"
        print(f"image built in {build_rootfs(tarball):.1f} s", flush=True)
        lab.start(tarball)
        os.environ.update(lab.env)
        try:
            results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
            cycle(lab, work, args.tasks, True)  # warm-up: supervisor upload, page cache, the image's layers
            for round_ in range(args.repeat):
                for boxed in (round_ % 2 == 0, round_ % 2 == 1):
                    results[boxed].append(cycle(lab, work, args.tasks, boxed))
            report(results, args.tasks)
        finally:
            lab.tear_down()


def report(results: dict[bool, list[dict[str, float]]], tasks: int) -> None:
    def median(boxed: bool, key: str) -> float:
        return statistics.median(r[key] for r in results[boxed])

    print(f"\n{tasks} tasks, median of {len(results[True])} rounds (seconds)")
    print(f"{'':<22}{'bare':>8}{'podman':>8}{'per task':>10}")
    for key in ("up -d", "down"):
        bare, boxed = median(False, key), median(True, key)
        print(f"{key:<22}{bare:>8.2f}{boxed:>8.2f}{(boxed - bare) / tasks:>+10.3f}")
    print(f"{'containers gone':<22}{'':>8}{median(True, 'containers gone'):>8.2f}   (from the start of down)")


if __name__ == "__main__":
    main()
