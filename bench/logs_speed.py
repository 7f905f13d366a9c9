"""Logs benchmark: `tfctl logs` against `ssh host cat` of the same files, and CPU per run.

Two measurements on simulated hosts (network namespaces with a real sshd each, see
bench/netns_hosts.py), on the lab prefix `tfctl-lg`, bridge `tfctlbr7`, subnet 10.77.7:

* speed: 8 tasks x 100k lines on 2 hosts (the tasks print everything at once, then wait); then
  `tfctl logs` (whole logs, no -f) is timed beside the floor, `ssh host cat <its logs>` on every
  host at once. Reported: wall, lines/s merged, lines lost (must be 0), per-task order kept, CPU
  on the controller and on the hosts (sshd and supervisor);
* run (--run-cpu): `tfctl up`, attached, of tasks that print ~10k lines over some seconds as a
  training run does (--mnist: the real TF1 MNIST example instead, ps + 2 workers); reported: CPU
  of the controller and of the host side (supervisors and sshd, the tasks' own CPU taken out), in
  core-seconds per second of run, for the whole run and for its steady middle.

Needs root, openssh-server and iproute2. Every run is stopped with `tfctl down` and the lab is
removed at the end.

    python -m bench.logs_speed [--lines 100000] [--tasks 8] [--repeat 3] [--compare DIR ...]
                               [--run-cpu] [--run-lines 10000] [--run-seconds 30] [--mnist]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.lab import TICK, Bench, BenchError, Sample, children_cpu, hosts_cpu, proc_cpu_ticks
from bench.netns_hosts import TestHost, TestHostLab, skip_reason
from bench.waiting import WaitTimeout, wait_until
from tfctl.supervisor.tasks import MONITOR_NAME

REPO = Path(__file__).resolve().parent.parent
PREFIX, BRIDGE, SUBNET = "tfctl-lg", "tfctlbr7", "10.77.7"  # a lab of its own
WRITER = """\
import json, os, signal, socket, sys, time
name, count, seconds, then, cpu_dir = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
tag = name.encode()
conf = json.loads(os.environ["TF_CONFIG"])  # listen on its port, as a TF server would
me = conf["task"]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(conf["cluster"][me["type"]][me["index"]].rsplit(":", 1)[1])))
server.listen()

def line(i):
    return b"%s step %06d loss 0.%06d accuracy 0.%04d lr 0.001\\n" % (tag, i, i * 7919 % 1000000, i % 10000)

def report(*_):
    t = os.times()
    with open(os.path.join(cpu_dir, name), "w") as f:  # what it cost, for the run's figures
        f.write(str(t.user + t.system))
    sys.exit(0)

signal.signal(signal.SIGTERM, report)
out = sys.stdout.buffer
if seconds <= 0:
    for start in range(0, count, 10000):
        out.write(b"".join(line(i) for i in range(start, min(count, start + 10000))))
    out.flush()
else:
    began = time.monotonic()
    for i in range(count):
        out.write(line(i))
        out.flush()
        time.sleep(max(0.0, began + (i + 1) * seconds / count - time.monotonic()))
if then == "wait":
    signal.pause()
report()
"""
CPU_OF = """\
import os, resource, signal, subprocess, sys
out, argv = sys.argv[1], sys.argv[2:]
child = subprocess.Popen(argv)
signal.signal(signal.SIGTERM, lambda *_: child.terminate())
code = child.wait()
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(out, "w") as f:
    f.write(str(ru.ru_utime + ru.ru_stime))
sys.exit(code if code >= 0 else 128 - code)
"""


def cluster_yaml(bench: Bench, name: str, hosts: list[TestHost], jobs: str) -> Path:
    path = bench.work / f"{name}.yaml"
    path.write_text(f"""name: {name}
workdir: {bench.app}
python: {sys.executable}
grace_period: 5
startup_timeout: 60
ssh:
  config: {bench.lab.ssh_config}
  connect_timeout: 10
jobs:
{jobs}""")
    return path


def writers(bench: Bench, hosts: list[TestHost], tasks: int, count: int, seconds: float, then: str) -> str:
    spread = ", ".join(f"{hosts[i % len(hosts)].name}:{3000 + i}" for i in range(tasks))
    cmd = f"{{python}} writer.py w{{task_index}} {count} {seconds:g} {then} {bench.app / 'cpu'}"
    return f'  worker:\n    hosts: [{spread}]\n    command: "{cmd}"\n'


def tfctl(bench: Bench, src: Path, home: Path, *argv: str, hosts: list[TestHost] | None = None) -> Sample:
    env = {**bench.env_for(src), "TFCTL_HOME": str(home)}
    return bench.timed([sys.executable, "-m", "tfctl", *argv], env=env, settle_hosts=hosts)


def check_lines(out: str, tasks: int, count: int) -> tuple[int, int, bool]:
    """(lines, lost, in order): every task's lines are `w<i> step <n> ...`, n from 0 to count-1."""
    seen: dict[str, list[int]] = {}
    total = 0
    for text in out.splitlines():
        total += 1
        words = text.split(" step ", 1)  # "[worker:3] w3 step 000123 ..." (ssh cat: no prefix)
        if len(words) == 2:
            seen.setdefault(words[0].rsplit(" ", 1)[-1], []).append(int(words[1][:6]))
    lost = sum(count - len(set(steps)) for steps in seen.values()) + count * (tasks - len(seen))
    ordered = all(steps == list(range(count)) for steps in seen.values())
    return total, lost, ordered


def floor(bench: Bench, hosts: list[TestHost], run_id: str) -> Sample:
    """`ssh host cat <its task logs>` on every host at once, each into a pipe of its own."""
    cpu0, host0, t0 = children_cpu(), hosts_cpu(hosts), time.perf_counter()
    procs = [
        subprocess.Popen(
            ["ssh", "-F", str(bench.lab.ssh_config), h.name, "cat", *sorted(map(str, logs_of(h, run_id)))],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        for h in hosts
    ]
    outs: list[bytes] = []
    readers = [threading.Thread(target=lambda p=p: outs.append(p.stdout.read())) for p in procs]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    rc = max(p.wait() for p in procs)
    wall = time.perf_counter() - t0
    time.sleep(0.3)  # let each host's sshd reap the sessions that just ended
    out = b"".join(outs).decode()
    return Sample(wall, children_cpu() - cpu0, hosts_cpu(hosts) - host0, out=out, rc=rc)


def speed(bench: Bench, args: argparse.Namespace, trees: list[Path]) -> None:
    hosts = bench.lab.hosts[:2]
    home = bench.new_home(2)
    cluster = cluster_yaml(bench, "logs", hosts, writers(bench, hosts, args.tasks, args.lines, 0, "wait"))
    up = tfctl(bench, trees[0], home, "-f", str(cluster), "up", "-d")
    if up.rc:
        raise BenchError("tfctl up failed:\n" + "\n".join(line for _, line in up.lines[-15:]))
    run_id = up.out.strip().splitlines()[-1]
    try:
        want = args.tasks * args.lines
        try:
            wait_until(
                lambda: sum(len(p.read_bytes().splitlines()) for h in hosts for p in logs_of(h, run_id)) >= want,
                120,
                "the writers finishing",
                interval=0.5,
            )
        except WaitTimeout:
            raise BenchError("the writers did not finish within 120 s") from None
        record = json.loads((home / "runs" / run_id / "run.json").read_text())
        watcher = record["watcher"]["pid"]
        # The same run seen from a TFCTL_HOME whose record names no controller: `logs` there reads
        # the hosts itself, as when the run has no live controller on this machine.
        direct = bench.new_home(2)
        (direct / "runs" / run_id).mkdir(parents=True)
        (direct / "runs" / run_id / "run.json").write_text(json.dumps({**record, "watcher": None}))

        def through_watcher(tree: Path) -> Sample:
            """`logs` that the run's live watcher reads with its own connections: its CPU is the
            command's plus the watcher's; the hosts' is not counted (their sessions stay open)."""
            before = proc_cpu_ticks(watcher)
            s = tfctl(bench, tree, home, "logs", "--run", run_id)
            return Sample(s.wall, s.cpu + (proc_cpu_ticks(watcher) - before) / TICK, out=s.out, rc=s.rc)

        results: dict[str, list[Sample]] = {}
        for r in range(args.warmup + args.repeat):
            for label, run in (
                [("ssh cat", lambda: floor(bench, hosts, run_id))]
                + [
                    (f"{t} direct", lambda t=t: tfctl(bench, t, direct, "logs", "--run", run_id, hosts=hosts))
                    for t in trees
                ]
                + [(f"{t} via the watcher", lambda t=t: through_watcher(t)) for t in trees[:1]]
            ):
                s = run()
                total, lost, ordered = check_lines(s.out, args.tasks, args.lines)
                if s.rc or lost or not ordered or total != want:
                    raise BenchError(f"{label}: rc {s.rc}, {total} lines of {want}, {lost} lost, ordered {ordered}")
                print(f"  round {r}{' (warm-up)' if r < args.warmup else ''} {label}: {s.wall:.2f}s", flush=True)
                if r >= args.warmup:
                    results.setdefault(label, []).append(s)
        print(f"\n{args.tasks} tasks x {args.lines} lines on {len(hosts)} hosts, median of {args.repeat}:")
        print(f"{'':44} {'wall s':>7} {'lines/s':>10} {'ctl cpu s':>10} {'host cpu s':>11}  lost  order")
        for label, samples in results.items():
            wall = statistics.median(s.wall for s in samples)
            ctl = statistics.median(s.cpu for s in samples)
            host = statistics.median(s.host_cpu for s in samples)
            hosts_text = "-" if host != host else f"{host:.2f}"  # NaN: not measured
            print(f"{label[-44:]:44} {wall:7.2f} {want / wall:10,.0f} {ctl:10.2f} {hosts_text:>11}     0  kept")
    finally:
        tfctl(bench, trees[0], home, "-f", str(cluster), "down")


def logs_of(host: TestHost, run_id: str) -> list[Path]:
    return list(Path(host.home).glob(f".tfctl/hosts/*/tasks/{run_id}/*/output.log"))


class Sampler:
    """CPU ticks of every process on the hosts and of the controller, by kind, every 0.25 s:
    rates over a window in the middle of a run (a process's last ticks before it exits are lost)."""

    def __init__(self, hosts: list[TestHost], controller: int) -> None:
        self.hosts, self.controller = hosts, controller
        self.ticks: dict[int, tuple[str, int]] = {}
        self.marks: list[tuple[float, dict[int, tuple[str, int]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for pid in [self.controller] + [p for h in self.hosts for p in h.pids()]:
                ticks = proc_cpu_ticks(pid)
                if ticks:
                    self.ticks[pid] = (self._kind(pid), ticks)
            self.marks.append((time.monotonic(), dict(self.ticks)))

    def _kind(self, pid: int) -> str:
        if pid == self.controller:
            return "controller"
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            comm = Path(f"/proc/{pid}/comm").read_bytes().strip()
        except OSError:
            return "gone"
        if cmd[0].endswith(b"sshd") or cmd[0].startswith(b"sshd"):
            return "sshd"
        if comm == MONITOR_NAME:  # forked from the supervisor, whose cmdline it keeps
            return "monitor"
        if b"serve" in cmd:
            return "supervisor"
        return "task"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def rates(self, skip: float) -> tuple[float, dict[str, float], list[tuple[float, int, str]]]:
        """Seconds of the window, each kind's CPU in cores and the busiest processes, leaving
        `skip` s out at each end."""
        t_end = self.marks[-1][0] - skip
        t0, first = next((t, m) for t, m in self.marks if t >= self.marks[0][0] + skip)
        t1, last = next((t, m) for t, m in reversed(self.marks) if t <= t_end)
        span = max(t1 - t0, 1e-9)
        per_pid = {
            pid: (kind, (ticks - first.get(pid, (kind, 0))[1]) / TICK / span) for pid, (kind, ticks) in last.items()
        }
        kinds: dict[str, float] = {}
        for kind, rate in per_pid.values():
            kinds[kind] = kinds.get(kind, 0.0) + rate
        busiest = sorted(((rate, pid, kind) for pid, (kind, rate) in per_pid.items()), reverse=True)[:6]
        return span, dict(sorted(kinds.items())), busiest


def run_cpu(bench: Bench, args: argparse.Namespace, src: Path) -> None:
    hosts = bench.lab.hosts[:3]
    home = bench.new_home(3)
    cpu_dir = bench.app / "cpu"
    cpu_dir.mkdir(exist_ok=True)
    for f in cpu_dir.iterdir():
        f.unlink()
    if args.mnist:
        train = REPO / "examples" / "mnist" / "train.py"
        flags = "--job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} --worker_hosts={worker_hosts}"
        steps = f"--train_steps {args.mnist_steps}"
        cmd = f"{{python}} cpu_of.py {cpu_dir}/{{job_name}}{{task_index}} {{python}} {train} {flags} {steps}"
        jobs = (
            f'  ps:\n    hosts: [{hosts[0].name}:2222]\n    command: "{cmd}"\n'
            f'  worker:\n    hosts: [{hosts[1].name}:2223, {hosts[2].name}:2223]\n    command: "{cmd}"\n'
        )
    else:
        jobs = writers(bench, hosts, 3, args.run_lines // 3, args.run_seconds, "exit")
    cluster = cluster_yaml(bench, "run", hosts, jobs)
    env = {**bench.env_for(src), "TFCTL_HOME": str(home)}
    h0 = hosts_cpu(hosts)
    holder: list[Sample] = []
    thread = threading.Thread(
        target=lambda: holder.append(bench.timed([sys.executable, "-m", "tfctl", "-f", str(cluster), "up"], env=env))
    )
    thread.start()
    pid = 0
    while not pid and thread.is_alive():
        tfctl_up = (p for p in children_of(os.getpid()) if b"\0-m\0tfctl\0" in Path(f"/proc/{p}/cmdline").read_bytes())
        pid = next(tfctl_up, 0)  # not the lab's own children, whose names hold the prefix
        time.sleep(0.01)
    sampler = Sampler(hosts, pid)
    thread.join()
    sampler.stop()
    up = holder[0]
    time.sleep(1.5)  # the hosts' sshd reap the last sessions and monitors
    host_total = hosts_cpu(hosts) - h0
    tasks_cpu = sum(float(f.read_text()) for f in cpu_dir.iterdir())
    lines = len([line for line in up.out.splitlines() if line.startswith("[")])
    tfctl(bench, src, home, "-f", str(cluster), "down")
    print(f"\nrun of {'MNIST' if args.mnist else 'writers'}: rc {up.rc}, {lines} task lines, {up.wall:.1f} s")
    if up.rc:
        print("\n".join(line for _, line in up.lines[-10:]))
    host_side = host_total - tasks_cpu
    print(f"  whole run: controller {up.cpu:.2f} CPU s, host side {host_side:.2f} CPU s (tasks' own {tasks_cpu:.2f})")
    per_s = f"controller {up.cpu / up.wall:.3f}, hosts {host_side / up.wall:.3f}"
    print(f"  whole run: {(up.cpu + host_side) / up.wall:.3f} core ({per_s})")
    span, rates, busiest = sampler.rates(skip=min(10.0, up.wall / 4))
    shown = ", ".join(f"{k} {v:.4f}" for k, v in rates.items() if k != "task")
    tfctl_side = sum(v for k, v in rates.items() if k not in ("task", "gone"))
    tasks = rates.get("task", 0.0)
    print(f"  steady {span:.0f} s in the middle: {tfctl_side:.4f} core for tfctl ({shown}; tasks {tasks:.3f})")
    print("  busiest: " + ", ".join(f"{kind} {pid} {rate:.4f}" for rate, pid, kind in busiest))


def children_of(pid: int) -> list[int]:
    """Children started by any thread of `pid`."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=100_000, help="lines per task (default 100000)")
    ap.add_argument("--tasks", type=int, default=8, help="tasks, spread over 2 hosts (default 8)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--src", default=str(REPO), help="tfctl tree to measure (default: this repo)")
    ap.add_argument("--compare", action="append", default=[], metavar="DIR", help="another tree, same rounds")
    ap.add_argument("--no-speed", action="store_true", help="skip the speed measurement")
    ap.add_argument("--run-cpu", action="store_true", help="measure CPU during a run that logs as it trains")
    ap.add_argument("--run-lines", type=int, default=10_000)
    ap.add_argument("--run-seconds", type=float, default=30.0)
    ap.add_argument("--mnist", action="store_true", help="the run is the real TF1 MNIST example")
    ap.add_argument("--mnist-steps", type=int, default=20000)
    args = ap.parse_args()
    if reason := skip_reason():
        print(f"cannot build the lab here: {reason}")
        return 2
    trees = [Path(args.src).resolve()] + [Path(d).resolve() for d in args.compare]
    with tempfile.TemporaryDirectory(prefix="tfctl-logs-bench-") as tmp:
        work = Path(tmp)
        with TestHostLab(3, workdir=work / "lab", prefix=PREFIX, bridge=BRIDGE, subnet=SUBNET) as lab:
            bench = Bench(lab, work, trees[0])
            (bench.app / "writer.py").write_text(WRITER)
            (bench.app / "cpu_of.py").write_text(CPU_OF)
            (bench.app / "cpu").mkdir()
            print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; trees: {[str(t) for t in trees]}")
            if not args.no_speed:
                speed(bench, args, trees)
            if args.run_cpu:
                run_cpu(bench, args, trees[0])
            print(json.dumps({"leftovers": bench.leftovers()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
