"""The benchmark's lab: simulated hosts (bench/netns_hosts.py), timed commands, the SSH floors.

Everything measured runs as a subprocess, so wall time is what a user waits and the CPU counters
of the controller (our reaped children) and of the lab hosts (each host's sshd is PID 1 of its
PID namespace and reaps all that ran there) say who did the work. The caller puts the tfctl
tree under test first on sys.path before importing this module.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.netns_hosts import TestHost, TestHostLab
from bench.waiting import WaitTimeout, wait_until
from tfctl.supervisor.procfs import is_same_process, proc_env_markers

REPO = Path(__file__).resolve().parent.parent
FAKE_TASK = REPO / "tests" / "tasks" / "fake_task.py"
PREFIX, BRIDGE, SUBNET = "tfctl-b", "tfctlbr5", "10.77.5"  # never the test suite's tfctl-t/tfctlbr0/10.77.0
PS_PORT, WORKER_PORT = 2222, 2223  # host 0 runs the ps and worker:0, so the worker port differs
LAUNCH_MARK = "bench-pdsh-launch"  # the TFCTL_RUN_ID of the tasks the pdsh launcher starts
CMD_TIMEOUT = 240.0
TICK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    pass


def make_lab(n: int, work: Path) -> TestHostLab:
    """n hosts on the benchmark's own prefix, bridge and subnet; `with` it to create and remove them."""
    return TestHostLab(n, workdir=work / "lab", prefix=PREFIX, bridge=BRIDGE, subnet=SUBNET)


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def proc_cpu_ticks(pid: int, children: bool = False) -> int:
    """utime + stime of a process (and, with children, of all it reaped), in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(x) for x in fields[11 : 15 if children else 13])


def hosts_cpu(hosts: list[TestHost]) -> float:
    """CPU seconds used on the lab hosts by processes already reaped (sessions, shells, agents):
    each host's sshd is PID 1 of its PID namespace, so it reaps every orphan there too."""
    return sum(proc_cpu_ticks(h.init_pid, children=True) for h in hosts) / TICK


def live_hosts_cpu(hosts: list[TestHost]) -> float:
    """CPU seconds of every process alive on the hosts plus all they reaped: deltas of this count
    everything a host ran in between, long-lived sessions included."""
    return sum(proc_cpu_ticks(pid, children=True) for h in hosts for pid in h.pids()) / TICK


@dataclass
class Sample:
    """One timed command: wall seconds, controller CPU (the command and its reaped children), host
    CPU, its stderr lines with their arrival times, its stdout, and when (epoch) it was spawned."""

    wall: float
    cpu: float
    host_cpu: float = float("nan")
    lines: list[tuple[float, str]] = field(default_factory=list)
    out: str = ""
    rc: int = 0
    pid: int = 0
    spawned: float = 0.0


class Bench:
    """The lab hosts, a scratch work dir, and how commands are run against them."""

    def __init__(self, lab: TestHostLab, work: Path, src: Path) -> None:
        self.lab = lab
        self.work = work
        base = {k: v for k, v in os.environ.items() if k not in ("TFCTL_HOME", "TFCTL_TRACE")}
        self._base = {**base, "NO_COLOR": "1"}
        self.env = self.env_for(src)
        self.homes = 0
        self.reuse_homes = False
        self._kept: dict[tuple[int, Path | None], Path] = {}
        self.app = work / "app"
        self.app.mkdir(parents=True, exist_ok=True)
        shutil.copy(FAKE_TASK, self.app / "fake_task.py")

    def env_for(self, src: Path) -> dict[str, str]:
        """Our environment with `src` first on PYTHONPATH: subprocesses run that tfctl tree."""
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        return {**self._base, "PYTHONPATH": os.pathsep.join([str(src), *rest])}

    def timed(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        settle_hosts: list[TestHost] | None = None,
        timeout: float = CMD_TIMEOUT,
    ) -> Sample:
        """Run argv, timestamping each stderr line as it arrives; wall and CPU of the command."""
        cpu0 = children_cpu()
        hcpu0 = hosts_cpu(settle_hosts) if settle_hosts else 0.0
        lines: list[tuple[float, str]] = []
        out: list[str] = []
        spawned, t0 = time.time(), time.perf_counter()
        # cwd: never the repo, or `python -m tfctl` would import ./tfctl whatever PYTHONPATH says
        proc = subprocess.Popen(
            argv,
            env=env or self.env,
            cwd=self.work,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = proc.stdout, proc.stderr
        reader = threading.Thread(target=lambda: out.append(stdout.read()), daemon=True)
        reader.start()
        killer = threading.Timer(timeout, proc.kill)  # our own child, by its Popen handle
        killer.start()
        try:
            for line in stderr:
                lines.append((time.perf_counter() - t0, line.rstrip("\n")))
            rc = proc.wait()
        finally:
            killer.cancel()
        wall = time.perf_counter() - t0
        reader.join()
        cpu = children_cpu() - cpu0
        host_cpu = float("nan")
        if settle_hosts:
            time.sleep(0.3)  # let each host's sshd reap the sessions that just ended
            host_cpu = hosts_cpu(settle_hosts) - hcpu0
        if wall >= timeout:
            raise BenchError(f"timed out after {timeout:g}s: {' '.join(map(str, argv))}")
        return Sample(wall, cpu, host_cpu, lines, "".join(out), rc, proc.pid, spawned)

    def new_home(self, n: int, tree: Path | None = None) -> Path:
        """A fresh TFCTL_HOME, so no run or pinned key carries over between cycles; with
        `reuse_homes`, one per size and tree (the benchmarks that compare no trees pass none),
        so each `up` follows the run before it, as a user's second run does."""
        if self.reuse_homes and (n, tree) in self._kept:
            return self._kept[n, tree]
        self.homes += 1
        home = self.work / f"home-{n}-{self.homes}"
        home.mkdir(mode=0o700)
        self._kept[n, tree] = home
        return home

    def cluster_file(self, n: int) -> Path:
        """1 ps on host 0 and one worker per host, each a fake task that listens forever."""
        hosts = self.lab.hosts[:n]
        cmd = "{python} fake_task.py --name {job_name}{task_index} --sleep -1 --port "
        workers = ", ".join(f"{h.name}:{WORKER_PORT}" for h in hosts)
        path = self.work / f"cluster-{n}.yaml"
        path.write_text(f"""name: fanout{n}
workdir: {self.app}
python: {sys.executable}
grace_period: 5
startup_timeout: 60
ssh:
  config: {self.lab.ssh_config}
  connect_timeout: 10
jobs:
  ps:
    hosts: [{hosts[0].name}:{PS_PORT}]
    command: "{cmd}{PS_PORT}"
  worker:
    hosts: [{workers}]
    command: "{cmd}{WORKER_PORT}"
""")
        return path

    # -- the floor: doing nothing on N hosts over OpenSSH

    def pdsh(self, n: int) -> Sample:
        return self._pdsh(n, "true", settle=True)

    def pdsh_launch(self, n: int) -> Sample:
        """A bash launcher's `up -d`: one pdsh starts the cluster file's tasks in the background
        (the ps on host 0, a worker on every host), checks nothing and returns. The tasks carry a
        TFCTL_RUN_ID of their own, so they are found and stopped by pid like a run's leftovers."""

        def start(name: str, port: int) -> str:
            task = f"{shlex.quote(sys.executable)} {FAKE_TASK.name} --name {name} --sleep -1 --port {port}"
            return f"TFCTL_RUN_ID={LAUNCH_MARK} nohup {task} </dev/null >/dev/null 2>&1 &"

        script = (
            f"cd {shlex.quote(str(self.app))} && "
            f'if [ "$(hostname)" = {self.lab.hosts[0].name} ]; then {start("ps0", PS_PORT)} fi; '
            f"{start('worker', WORKER_PORT)}"
        )
        try:
            s = self._pdsh(n, script, settle=False)
            # Each host's sessions end before its task has its marker. Those still missing after
            # that are found by check_clean.
            launched = f"the {n + 1} tasks pdsh launched"
            with contextlib.suppress(WaitTimeout):
                wait_until(lambda: sum(map(len, self.leftovers(LAUNCH_MARK).values())) >= n + 1, 10, launched)
        finally:
            self.stop_leftovers(LAUNCH_MARK)
        return s

    def _pdsh(self, n: int, command: str, settle: bool) -> Sample:
        """`command` on the first n hosts at once, through the lab's ssh config; `settle`: count
        the hosts' CPU too."""
        hosts = self.lab.hosts[:n]
        s = self.timed(
            ["pdsh", "-R", "ssh", "-f", str(max(32, n)), "-w", ",".join(h.name for h in hosts), command],
            env={**self.env, **self.lab.pdsh_env()},
            settle_hosts=hosts if settle else None,
        )
        if s.rc != 0:
            raise BenchError(f"pdsh {command!r} failed ({s.rc}): {' / '.join(line for _, line in s.lines)}")
        return s

    def stop_leftovers(self, run_id: str | None = None) -> None:
        """Kill by pid what `leftovers` finds, and wait until it is gone."""
        for pid in (p for pids in self.leftovers(run_id).values() for p in pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        with contextlib.suppress(WaitTimeout):  # the caller's check_clean reports what is left
            wait_until(lambda: not self.leftovers(run_id), 5, "the killed processes gone")

    def sequential_ssh(self, n: int) -> Sample:
        hosts = self.lab.hosts[:n]
        script = "; ".join(f"ssh -F {self.lab.ssh_config} {h.name} true || exit 1" for h in hosts)
        s = self.timed(["/bin/sh", "-c", script], settle_hosts=hosts)
        if s.rc != 0:
            raise BenchError(f"sequential ssh failed ({s.rc}): {' / '.join(line for _, line in s.lines)}")
        return s

    # -- cleanliness

    def leftovers(self, run_id: str | None = None) -> dict[str, list[int]]:
        """Processes carrying a TFCTL_RUN_ID (`run_id`: that one), per lab host."""
        left = {
            h.name: [p for p in h.pids() if (mark := proc_env_markers(p)[0]) and run_id in (None, mark)]
            for h in self.lab.hosts
        }
        return {k: v for k, v in left.items() if v}

    def check_clean(self, home: Path) -> list[str]:
        """No process with a TFCTL_RUN_ID on any lab host, and no detached watcher left running;
        whatever is found is killed by pid and reported."""
        problems = []
        try:
            wait_until(self.leftovers, 5, "no process left", until=lambda left: not left, interval=0.1)
        except WaitTimeout as late:
            problems.append(f"processes with TFCTL_RUN_ID left on lab hosts: {late.last} (killed)")
            self.stop_leftovers()
        for run_json in (home / "runs").glob("*/run.json"):
            w = _watcher(run_json)
            if not w:
                continue
            try:
                wait_until(functools.partial(is_same_process, w), 5, "the watcher gone", until=lambda alive: not alive)
            except WaitTimeout:
                problems.append(f"detached watcher pid {w['pid']} still running after down (killed)")
                os.kill(w["pid"], signal.SIGKILL)
        return problems


def _watcher(run_json: Path) -> dict | None:
    return json.loads(run_json.read_text()).get("watcher")


def watcher_pid(home: Path, run_id: str) -> int | None:
    """The detached watcher `up -d` recorded for the run, if any."""
    return (_watcher(home / "runs" / run_id / "run.json") or {}).get("pid")
