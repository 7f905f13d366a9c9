"""How long an attached `up` takes to end after one host freezes: from the SIGSTOP of every
process of that host to the exit of `up`, on a quiet machine and with busy loops beside it.

The run's promise (the engine issue): at most `host_timeout` + 10 s, while the healthy hosts
train on. Root is needed (the simulated hosts of `bench/netns_hosts.py`). From the repo root:

    python -m bench.frozen_host                       # host_timeout 25, quiet and 4 busy loops, 2 rounds
    python -m bench.frozen_host --host-timeout 12 --busy 0 --repeat 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from bench.netns_hosts import TestHostLab
from bench.waiting import wait_until
from tfctl.supervisor.procfs import proc_env_markers

FAKE_TASK = Path(__file__).resolve().parents[1] / "tests" / "tasks" / "fake_task.py"
COMMAND = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --sleep -1"


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """`count` shell loops spinning on the machine's cores, stopped by pid afterwards."""
    loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def write_cluster(directory: Path, lab: TestHostLab, host_timeout: float) -> Path:
    work = directory / "work"
    work.mkdir(parents=True)
    shutil.copy(FAKE_TASK, work / "fake_task.py")
    cluster = directory / "cluster.yaml"
    cluster.write_text(f"""name: frozen
workdir: {work}
python: {sys.executable}
grace_period: 2
startup_timeout: 60
lease_timeout: 6
host_timeout: {host_timeout:g}
ssh:
  config: {lab.ssh_config}
  connect_timeout: 3
command: "{COMMAND}"
jobs:
  ps: [tfh0:2222]
  worker: [tfh1:2222, tfh2:2222, tfh3:2222]
""")
    return cluster


def one_round(lab: TestHostLab, directory: Path, host_timeout: float) -> float:
    """Seconds from the freeze of tfh3 to the exit of the attached `up`."""
    home = directory / "home"
    env = {**os.environ, "TFCTL_HOME": str(home)}
    cluster = write_cluster(directory, lab, host_timeout)
    up = subprocess.Popen(
        [sys.executable, "-m", "tfctl", "-f", str(cluster), "up"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    frozen = lab.host("tfh3")
    try:
        assert up.stderr is not None
        for line in up.stderr:
            if "all 4 tasks running" in line:
                break
        else:
            raise SystemExit(f"`up` ended before its tasks ran (exit code {up.wait()})")
        frozen.signal_all(signal.SIGSTOP)
        froze = time.monotonic()
        if os.environ.get("BENCH_VERBOSE"):
            print("froze at", time.strftime("%H:%M:%S"))
        for line in up.stderr:
            if os.environ.get("BENCH_VERBOSE"):
                print(f"{time.monotonic() - froze:6.1f} {line.rstrip()}")
        up.wait(host_timeout + 120)
        took = time.monotonic() - froze
    finally:
        frozen.signal_all(signal.SIGCONT)
        if up.poll() is None:
            up.kill()
            up.wait()
    listed = subprocess.run([sys.executable, "-m", "tfctl", "runs", "--json"], env=env, capture_output=True, text=True)
    run_id = json.loads(listed.stdout)[-1]["run_id"]

    def left() -> list[int]:
        return [pid for host in lab.hosts for pid in host.pids() if proc_env_markers(pid)[0] == run_id]

    # Thawed, tfh3's task stops by its lease (6 s); the next round needs its port.
    wait_until(lambda: not left(), 60, "the thawed host stopping the run's task")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-timeout", type=float, default=25.0)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 4], help="busy loops beside the run, per series")
    parser.add_argument("--repeat", type=int, default=2)
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tfctl-frozen-") as scratch, TestHostLab(4, workdir=Path(scratch)) as lab:
        for busy in options.busy:
            times = []
            for number in range(options.repeat):
                with busy_loops(busy):
                    times.append(one_round(lab, Path(scratch) / f"b{busy}-{number}", options.host_timeout))
            rows.append((busy, times))
    print(f"host_timeout {options.host_timeout:g} s; promise: up ends within {options.host_timeout + 10:g} s")
    print("busy loops | seconds from freeze to the exit of `up`")
    for busy, times in rows:
        print(f"{busy:>10} | {', '.join(f'{t:.1f}' for t in times)}")


if __name__ == "__main__":
    main()
