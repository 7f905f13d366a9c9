"""Seeded fault injection on simulated SSH hosts: start a run, break something, then prove that
nothing of the run is left on any host, every task port is free, and every line a task wrote
reads back through `tfctl logs`.

Used by tests/test_faults.py (a short series in CI) and bench/faults.py (a long one). One cycle:
a ps on tfh0 and two ticking workers on tfh1 and tfh2 (TF ports 2222), started attached or
detached; after a random delay, one fault from FAULTS (`disk_full`: a small tmpfs over tfh1's
~/.tfctl/hosts, filled for a moment; `freeze_host`: every process of tfh2 SIGSTOPped for a
moment, shorter than host_timeout, while tfh1's worker must train on); then tfctl must clean up
by itself (the lease, the idle rule, the watcher), except for a host that is gone, which `down`
cleans once it is back. The random generator is seeded, so a failing series is replayed by its
seed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from bench.netns_hosts import TestHost, TestHostLab
from bench.waiting import wait_until
from tfctl.supervisor.procfs import proc_cmdline, proc_env_markers

REPO = Path(__file__).resolve().parent.parent
FAKE_TASK = REPO / "tests" / "tasks" / "fake_task.py"
PORT = 2222
FAULTS = (
    "kill_attached_up",
    "kill_watcher",
    "kill_ps",
    "kill_worker",
    "kill_worker_with_restart",
    "kill_host_tfctl",
    "link_flap",
    "host_gone",
    "disk_full",
    "freeze_host",
)
SELF_CLEANING_WITHIN = 40.0  # seconds from the fault until no process of the run is left


@dataclass(frozen=True)
class CycleResult:
    number: int
    fault: str
    detail: str  # which host or task, how long
    run_id: str
    state: str  # how the run store recorded the run's end
    cleanup_seconds: float  # from the fault until nothing of the run ran anywhere
    lines: int  # lines the tasks wrote, all compared with `tfctl logs`
    lines_lost: int


class FaultError(AssertionError):
    pass


class FaultLab:
    """Runs fault cycles on a 3-host lab with a private TFCTL_HOME under `work`."""

    def __init__(self, lab: TestHostLab, work: Path) -> None:
        self.lab = lab
        self.work = work
        self.home = work / "tfctl-home"
        self.env = {**os.environ, "TFCTL_HOME": str(self.home)}

    # -- one cycle

    def cycle(self, number: int, rng: random.Random, fault: str) -> CycleResult:
        restart = fault == "kill_worker_with_restart"
        # A gone host must fail the run by host_timeout, before the job could end by itself.
        seconds = {"host_gone": 30.0, "freeze_host": 6.0}.get(fault) or rng.uniform(3, 5)
        cluster = self._write_cluster(number, worker_seconds=seconds, restart=restart)
        attached = fault == "kill_attached_up"
        with self._small_disk(self.lab.host("tfh1") if fault == "disk_full" else None):
            return self._cycle(number, rng, fault, cluster, attached)

    def _cycle(self, number: int, rng: random.Random, fault: str, cluster: Path, attached: bool) -> CycleResult:
        up, run_id = self._start(cluster, attached)
        try:
            time.sleep(rng.uniform(0.2, 1.5))  # deliberately: the fault strikes at a random moment of the run
            began = time.monotonic()
            detail = self._inject(fault, rng, up, run_id)
            cleaned = f"{fault}: the run cleaning up"
            wait_until(lambda: self.run_pids(run_id) == {}, SELF_CLEANING_WITHIN, cleaned, interval=0.2)
            cleanup = time.monotonic() - began
        finally:
            if up is not None and up.poll() is None:
                up.kill()
                up.wait()
            for host in self.lab.hosts:
                host.set_link(True)
        down = self.tfctl("-f", str(cluster), "down", "--run", run_id)
        if down.returncode != 0 or "0 remain" not in down.stderr:
            raise FaultError(f"{fault}: down after the cycle: {down.stderr[-2000:]}")
        self._check_nothing_left(fault, run_id)
        lines, lost = self._check_logs(fault, run_id)
        state = self._run(run_id)["state"]
        return CycleResult(number, fault, detail, run_id, state, cleanup, lines, lost)

    def _inject(self, fault: str, rng: random.Random, up: subprocess.Popen | None, run_id: str) -> str:
        if fault == "kill_attached_up":
            assert up is not None
            up.kill()
            return f"up pid {up.pid}"
        if fault == "kill_watcher":
            watcher = self._run_record(run_id)["watcher"]
            os.kill(watcher["pid"], signal.SIGKILL)
            return f"watcher pid {watcher['pid']}"
        if fault == "kill_ps":
            return self._kill_task(run_id, "tfh0", "ps:0")
        if fault in ("kill_worker", "kill_worker_with_restart"):
            return self._kill_task(run_id, "tfh2", "worker:1")
        if fault == "kill_host_tfctl":
            host = rng.choice(self.lab.hosts)
            pids = [p for p in host.pids() if ".tfctl/supervisor-" in proc_cmdline(p)]
            for pid in pids:
                _kill(pid)
            return f"{len(pids)} tfctl processes on {host.name}"
        if fault == "link_flap":
            host = rng.choice(self.lab.hosts)
            seconds = rng.uniform(0.5, 2.0)
            host.set_link(False)
            time.sleep(seconds)  # deliberately: the link stays down this long
            host.set_link(True)
            return f"{host.name} off for {seconds:.1f}s"
        if fault == "host_gone":
            host = self.lab.host("tfh2")
            host.set_link(False)
            wait_until(lambda: self._run(run_id)["state"] == "failed", 60, "host_gone: the run failing", interval=0.2)
            left = self.run_pids(run_id)
            if sorted(left) != ["tfh2"]:
                raise FaultError(f"host_gone: expected only tfh2's tasks left while it is away, found {left}")
            host.set_link(True)  # back: a later `down` must clean it
            down = self.tfctl("down", "--run", run_id)
            if down.returncode != 0:
                raise FaultError(f"host_gone: down once tfh2 was back: {down.stderr[-2000:]}")
            return "tfh2 away until the run failed"
        if fault == "disk_full":
            host = self.lab.host("tfh1")
            filler = f"{host.home}/.tfctl/hosts/filler"
            filled = host.exec(["sh", "-c", f"cat /dev/zero > {filler}"])
            if "No space left" not in filled.stderr:
                raise FaultError(f"disk_full: filling tfh1's disk: {filled.stderr}")
            began = time.monotonic()
            # Full until worker:0 there has ended: its monitor must live on, holding the end.
            wait_until(lambda: "tfh1" not in self.run_pids(run_id), 20, "disk_full: worker:0 ending", interval=0.2)
            if not [p for p in host.pids() if _comm(p).startswith("tfctl=")]:
                raise FaultError("disk_full: no monitor on tfh1 holds worker:0's end")
            host.exec(["rm", "-f", filler], check=True)
            return f"tfh1's disk full for {time.monotonic() - began:.1f}s, until worker:0 ended"
        if fault == "freeze_host":
            healthy = self.run_pids(run_id).get("tfh1", [])
            seconds = rng.uniform(0.5, 1.5)
            frozen = self.lab.host("tfh2")
            frozen.signal_all(signal.SIGSTOP)
            try:
                time.sleep(seconds)  # deliberately: the host stays frozen this long
                stopped = [pid for pid in healthy if not os.path.exists(f"/proc/{pid}")]
            finally:
                frozen.signal_all(signal.SIGCONT)
            if not healthy or stopped:
                raise FaultError(f"freeze_host: tfh1's worker (pids {healthy}) did not train on: {stopped} gone")
            return f"tfh2 frozen for {seconds:.1f}s while tfh1 trained on"
        raise ValueError(fault)

    @contextlib.contextmanager
    def _small_disk(self, host: TestHost | None) -> Iterator[None]:
        """A 2 MiB tmpfs over the host's ~/.tfctl/hosts (in its own mount namespace) meanwhile."""
        if host is None:
            yield
            return
        where = f"{host.home}/.tfctl/hosts"
        os.makedirs(where, exist_ok=True)
        host.exec(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", where], check=True)
        try:
            yield
        finally:
            host.exec(["rm", "-f", f"{where}/filler"])
            if host.exec(["umount", where]).returncode != 0:
                host.exec(["umount", "-l", where])

    def _kill_task(self, run_id: str, host_name: str, task: str) -> str:
        pids = [p for p in self.lab.host(host_name).pids() if proc_env_markers(p) == (run_id, task)]
        if not pids:
            raise FaultError(f"no process of {task} on {host_name} to kill")
        for pid in pids:
            _kill(pid)
        return f"{task} on {host_name} (pids {pids})"

    # -- checks

    def _check_nothing_left(self, fault: str, run_id: str) -> None:
        left = self.run_pids(run_id)
        if left:
            raise FaultError(f"{fault}: processes of {run_id} left: {left}")
        for host in self.lab.hosts:
            if _listening(host.address, PORT):
                raise FaultError(f"{fault}: port {PORT} still taken on {host.name}")

    def _check_logs(self, fault: str, run_id: str) -> tuple[int, int]:
        """Every line of every task's log on its host, read back through `tfctl logs`."""
        total = lost = 0
        for task, host in (("ps:0", "tfh0"), ("worker:0", "tfh1"), ("worker:1", "tfh2")):
            written = self._task_log(self.lab.host(host), run_id, task)
            shown = self.tfctl("logs", "--run", run_id, task)
            prefix = f"[{task}]".ljust(len("[worker:0]")) + " "  # aligned to the run's longest name
            read = [line.removeprefix(prefix) for line in shown.stdout.splitlines()]
            total += len(written)
            lost += sum(1 for line in written if line not in set(read))
            if read != written:
                raise FaultError(
                    f"{fault}: `tfctl logs {task}` differs from its log on {host}: "
                    f"{len(written)} lines written, {len(read)} read; first written {written[:3]}, read {read[:3]}"
                )
        return total, lost

    def _task_log(self, host: TestHost, run_id: str, task: str) -> list[str]:
        state = Path(host.home) / ".tfctl" / "hosts" / f"{host.name}-{host.machine_id.replace('-', '')[:12]}"
        path = state / "tasks" / run_id / task.replace(":", "-") / "output.log"
        seen = Path(f"/proc/{host.init_pid}/root{path}")  # as the host sees it (its own mounts)
        return seen.read_text(errors="replace").splitlines()

    # -- helpers

    def run_pids(self, run_id: str) -> dict[str, list[int]]:
        found = {}
        for host in self.lab.hosts:
            pids = [p for p in host.pids() if proc_env_markers(p)[0] == run_id]
            if pids:
                found[host.name] = pids
        return found

    def tfctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "tfctl", *args], capture_output=True, text=True, timeout=timeout, env=self.env
        )

    def _start(self, cluster: Path, attached: bool) -> tuple[subprocess.Popen | None, str]:
        if not attached:
            up = self.tfctl("-f", str(cluster), "up", "-d")
            if up.returncode != 0:
                raise FaultError(f"up -d failed: {up.stderr[-2000:]}")
            return None, up.stdout.strip()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfctl", "-f", str(cluster), "up"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        assert proc.stderr is not None
        stderr = proc.stderr

        def following() -> bool:
            if "following" in stderr.readline():
                return True
            assert proc.poll() is None, f"attached up exited with {proc.returncode}"
            return False

        try:
            wait_until(following, 60, "attached up following its run", interval=0)
        except AssertionError as e:
            proc.kill()
            raise FaultError(f"attached up did not start: {e}") from None
        return proc, self._runs()[-1]["run_id"]

    def _runs(self) -> list[dict]:
        return json.loads(self.tfctl("runs", "--json").stdout)

    def _run(self, run_id: str) -> dict:
        return next(r for r in self._runs() if r["run_id"] == run_id)

    def _run_record(self, run_id: str) -> dict:
        return json.loads((self.home / "runs" / run_id / "run.json").read_text())

    def _write_cluster(self, number: int, worker_seconds: float, restart: bool) -> Path:
        work = self.work / f"cycle-{number}"
        work.mkdir(parents=True, exist_ok=True)
        (work / "fake_task.py").write_bytes(FAKE_TASK.read_bytes())
        task = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --tick 0.05 --lines 0"
        restart_line = "\n    restart: {policy: on-failure, max_restarts: 2, backoff: 0.2}" if restart else ""
        path = work / "cluster.yaml"
        path.write_text(f"""name: faults{number}
workdir: {work}
python: {sys.executable}
grace_period: 1
startup_timeout: 30
lease_timeout: 2
idle_ps_timeout: 1
host_timeout: 3
ssh:
  config: {self.lab.ssh_config}
  connect_timeout: 2
  keepalive: 1
jobs:
  ps:
    hosts: [tfh0:{PORT}]
    command: "{task} --sleep -1"
  worker:
    hosts: [tfh1:{PORT}, tfh2:{PORT}]
    command: "{task} --sleep {worker_seconds:.1f}"{restart_line}
""")
        return path


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return ""


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def series(lab: FaultLab, seed: int, cycles: int, faults: tuple[str, ...] = FAULTS) -> list[CycleResult]:
    """`cycles` cycles, each fault in turn in an order and with timings drawn from `seed`."""
    rng = random.Random(seed)
    order = [faults[i % len(faults)] for i in range(cycles)]
    rng.shuffle(order)
    results = []
    for number, fault in enumerate(order):
        try:
            results.append(lab.cycle(number, rng, fault))
        except AssertionError as e:  # a FaultError, or a wait that timed out
            raise FaultError(f"seed {seed}, cycle {number}: {e}") from None
    return results
