#!/usr/bin/env python3
"""Fan-out benchmark: tfctl up/status/down over SSH against the pdsh / ssh floor.

Creates a lab of simulated hosts (network namespaces each running a real sshd, see
tests/netns_hosts.py) and measures, side by side, for each N in --hosts (default 4 16):

* floor:  `pdsh -R ssh -w <N hosts> true` (parallel OpenSSH) and a sequential `ssh -F cfg h true` loop;
* tfctl:  `python -m tfctl -f cluster.yaml up -d` (1 ps on host 0 + one worker per host, all
          tests/tasks/fake_task.py serving forever), then `status --json`, then `down`,
          each with a fresh TFCTL_HOME.

Every measurement is repeated --repeat times (after --warmup untimed rounds) and the median is
reported, with ratios to pdsh and the targets (status <= 1.5x, up and down <= 2x pdsh at N=16).
Then: a per-phase breakdown of one `up` (from the `[ 1.2s] who  message` progress lines tfctl
prints on stderr), a trace of one extra up/status/down (SSH handshakes and exec channels per
agent verb, measured by wrapping tfctl's SSH transport in-process; tfctl itself is unchanged),
and micro-benchmarks of the fixed costs (interpreter start-up, paramiko handshake, one exec
channel, one supervisor call).

Needs root, pdsh, openssh-server, iproute2 (like the netns tests). Traffic goes only to the lab's
addresses. Every run is stopped (`tfctl down` in a finally), the lab hosts are checked for any
process carrying TFCTL_RUN_ID, and the lab is removed at the end.

    python bench/fanout.py [--hosts 4 16] [--repeat 3] [--warmup 1] [--settle 2]
                           [--src DIR] [--compare DIR ...] [--no-trace] [--no-micro] [--keep]

See bench/README.md for how to read the output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE_TASK = REPO / "tests" / "tasks" / "fake_task.py"
PREFIX, BRIDGE, SUBNET = "tfctl-b", "tfctlbr5", "10.77.5"  # never the test suite's tfctl-t/tfctlbr0/10.77.0
PS_PORT, WORKER_PORT = 2222, 2223  # host 0 runs the ps and worker:0, so the worker port differs
CMD_TIMEOUT = 240.0
TARGETS = {"up": 2.0, "status": 1.5, "down": 2.0}
TARGET_N = 16

# tfctl progress line: "[  1.2s] worker:0     running (pid 123)" (who padded to 12 columns)
STAMP = re.compile(r"^\[\s*(\d+(?:\.\d+)?)s\] (.*)$")


# ============================================================================================
# `python bench/fanout.py _trace OUT -- ARGS`: run tfctl's CLI in this process with its SSH
# transport wrapped, recording every handshake and exec channel to OUT (JSON) at exit.


def _trace_main(out: str, args: list[str]) -> None:
    import atexit

    marks: dict[str, float] = {}
    # registered before paramiko's own atexit hook, so it runs after it (atexit is LIFO)
    atexit.register(lambda: Path(out + ".last").write_text(str(time.perf_counter())))

    import tfctl.hostagent as hostagent
    import tfctl.lifecycle as lifecycle
    import tfctl.transport.ssh as ssh
    from tfctl.cli import main

    t_start = time.perf_counter()
    with open("/proc/self/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as f:
        since_exec = float(f.read().split()[0]) - started  # interpreter start-up + tfctl imports (10 ms ticks)
    events: list[dict] = []
    lock = threading.Lock()

    def record(**ev) -> None:
        ev["thread"] = threading.get_ident()
        with lock:
            events.append(ev)

    orig_transport = ssh.SSHTransport._transport
    orig_run = ssh.SSHTransport.run
    orig_stream = ssh.SSHTransport.stream

    def _transport(self):
        fresh = not self._clients
        t0 = time.perf_counter()
        tr = orig_transport(self)
        if fresh:
            record(kind="connect", host=self.host, t0=t0 - t_start, t1=time.perf_counter() - t_start)
        return tr

    def run(self, command, **kw):
        t0 = time.perf_counter()
        try:
            return orig_run(self, command, **kw)
        finally:
            record(kind="exec", host=self.host, label=_label(command), t0=t0 - t_start,
                   t1=time.perf_counter() - t_start)

    def stream(self, command, **kw):
        t0 = time.perf_counter()
        try:
            return orig_stream(self, command, **kw)
        finally:
            record(kind="stream", host=self.host, label=_label(command), t0=t0 - t_start,
                   t1=time.perf_counter() - t_start)

    orig_call = hostagent.HostAgent.call

    def call(self, verb, *a, **kw):
        t0 = time.perf_counter()
        try:
            return orig_call(self, verb, *a, **kw)
        finally:
            record(kind="call", host=self.host, label=verb, t0=t0 - t_start, t1=time.perf_counter() - t_start)

    ssh.SSHTransport._transport = _transport
    ssh.SSHTransport.run = run
    ssh.SSHTransport.stream = stream
    hostagent.HostAgent.call = call

    for name in ("stop_watcher", "spawn_watcher", "ensure_no_live_run"):
        orig = getattr(lifecycle, name)

        def timed(*a, _orig=orig, _name=name, **kw):
            t0 = time.perf_counter()
            try:
                return _orig(*a, **kw)
            finally:
                record(kind="step", label=_name, t0=t0 - t_start, t1=time.perf_counter() - t_start)

        setattr(lifecycle, name, timed)

    def dump() -> None:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        Path(out).write_text(json.dumps({"events": events, "cpu": ru.ru_utime + ru.ru_stime, "t_start": t_start,
                                         "end": marks.get("main", time.perf_counter()) - t_start,
                                         "startup": since_exec}))

    atexit.register(dump)
    sys.argv = ["tfctl", *args]
    try:
        main()
    finally:
        marks["main"] = time.perf_counter()


def _label(command: str) -> str:
    """What an SSH command line is: an agent verb, the agent presence probe, or the agent upload."""
    if command.startswith("test -f "):
        return "test -f agent"
    if command.startswith("umask 077"):
        return "put agent"
    words = command.split()
    if len(words) >= 3 and "agent" in words[-2]:
        return words[-1]
    return command[:30]


if len(sys.argv) >= 4 and sys.argv[1] == "_trace" and sys.argv[3] == "--":
    # tfctl comes from PYTHONPATH, which the benchmark points at the source tree under test
    _trace_main(sys.argv[2], sys.argv[4:])
    sys.exit(0)  # not reached: tfctl's main() exits

# ============================================================================================

def _src_arg() -> Path:
    """--src DIR (the tfctl source tree to benchmark), read before anything imports tfctl."""
    for i, arg in enumerate(sys.argv):
        if arg == "--src" and i + 1 < len(sys.argv):
            return Path(sys.argv[i + 1]).resolve()
        if arg.startswith("--src="):
            return Path(arg.split("=", 1)[1]).resolve()
    return REPO


SRC = _src_arg()
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(SRC))
from netns_hosts import TestHostLab, skip_reason  # noqa: E402
from tfctl.supervisor.agent import is_same_process, proc_env_markers  # noqa: E402


class BenchError(RuntimeError):
    pass


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


TICK = os.sysconf("SC_CLK_TCK")


def hosts_cpu(hosts) -> float:
    """CPU seconds used on the lab hosts by processes already reaped (sessions, shells, agents):
    each host's sshd is PID 1 of its PID namespace, so it reaps every orphan there too."""
    total = 0
    for h in hosts:
        try:
            with open(f"/proc/{h.init_pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except OSError:
            pass
    return total / TICK


def live_hosts_cpu(hosts) -> float:
    """CPU seconds of every process alive on the hosts plus all they reaped: deltas of this count
    everything a host ran in between, long-lived sessions included."""
    total = 0
    for h in hosts:
        for pid in h.pids():
            total += proc_cpu_ticks(pid, children=True)
    return total / TICK


def proc_cpu_ticks(pid: int, children: bool = False) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(x) for x in fields[11:15 if children else 13])


class Sample:
    """One timed command: wall seconds, controller CPU (the command and its reaped children)."""

    def __init__(self, wall: float, cpu: float, host_cpu: float = float("nan"), lines=None, out: str = "",
                 rc: int = 0) -> None:
        self.wall, self.cpu, self.host_cpu, self.lines, self.out, self.rc = wall, cpu, host_cpu, lines or [], out, rc


class Bench:
    def __init__(self, lab: TestHostLab, work: Path) -> None:
        self.lab = lab
        self.work = work
        self.env = {k: v for k, v in os.environ.items() if k != "TFCTL_HOME"}
        self.env["NO_COLOR"] = "1"
        self.env = self.env_for(SRC)
        self.homes = 0
        self.settle = 2.0
        self.app = work / "app"
        self.app.mkdir(parents=True, exist_ok=True)
        shutil.copy(FAKE_TASK, self.app / "fake_task.py")

    def env_for(self, src: Path) -> dict[str, str]:
        """Our environment with `src` first on PYTHONPATH: subprocesses run that tfctl tree."""
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        return {**self.env, "PYTHONPATH": os.pathsep.join([str(src), *rest])}

    # ---------------------------------------------------------------- helpers

    def _timed(self, argv, env=None, settle_hosts=None, timeout=CMD_TIMEOUT) -> Sample:
        """Run argv, timestamping each stderr line as it arrives; wall and CPU of the command."""
        cpu0 = children_cpu()
        hcpu0 = hosts_cpu(settle_hosts) if settle_hosts else 0.0
        lines: list[tuple[float, str]] = []
        out: list[str] = []
        t0 = time.perf_counter()
        # cwd: never the repo, or `python -m tfctl` would import ./tfctl whatever PYTHONPATH says
        proc = subprocess.Popen(argv, env=env or self.env, cwd=self.work, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
        reader.start()
        killer = threading.Timer(timeout, proc.kill)  # our own child, by its Popen handle
        killer.start()
        try:
            for line in proc.stderr:
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
        return Sample(wall, cpu, host_cpu, lines, "".join(out), rc)

    def tfctl_argv(self, cluster: Path, *verb: str) -> list[str]:
        return [sys.executable, "-m", "tfctl", "-f", str(cluster), *verb]

    def new_home(self, n: int) -> Path:
        self.homes += 1
        home = self.work / f"home-{n}-{self.homes}"
        home.mkdir(mode=0o700)
        return home

    def cluster_file(self, n: int) -> Path:
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

    # ---------------------------------------------------------------- the floor

    def pdsh(self, n: int) -> Sample:
        hosts = self.lab.hosts[:n]
        env = {**self.env, **self.lab.pdsh_env()}
        s = self._timed(["pdsh", "-R", "ssh", "-f", str(max(32, n)), "-w", ",".join(h.name for h in hosts), "true"],
                        env=env, settle_hosts=hosts)
        if s.rc != 0:
            raise BenchError(f"pdsh failed ({s.rc}): {' / '.join(l for _, l in s.lines)}")
        return s

    def sequential_ssh(self, n: int) -> Sample:
        hosts = self.lab.hosts[:n]
        script = "; ".join(f"ssh -F {self.lab.ssh_config} {h.name} true || exit 1" for h in hosts)
        s = self._timed(["/bin/sh", "-c", script], settle_hosts=hosts)
        if s.rc != 0:
            raise BenchError(f"sequential ssh failed ({s.rc}): {' / '.join(l for _, l in s.lines)}")
        return s

    # ---------------------------------------------------------------- tfctl

    def tfctl_cycle(self, n: int, trace: bool = False, src: Path = SRC) -> dict:
        """up -d, status --json, down on the first n hosts; always downs; checks nothing is left."""
        cluster = self.cluster_file(n)
        hosts = self.lab.hosts[:n]
        home = self.new_home(n)
        env = {**self.env_for(src), "TFCTL_HOME": str(home)}
        traces: dict[str, dict] = {}

        def argv(*verb):
            if not trace:
                return self.tfctl_argv(cluster, *verb)
            out = home / f"trace-{verb[0]}.json"
            return [sys.executable, str(Path(__file__).resolve()), "_trace", str(out), "--",
                    "-f", str(cluster), *verb]

        result: dict = {}
        try:
            up = self._timed(argv("up", "-d"), env=env, settle_hosts=hosts)
            result["up"] = up
            if up.rc != 0:
                raise BenchError(f"tfctl up failed ({up.rc}):\n" + "\n".join(l for _, l in up.lines[-15:]))
            run_id = up.out.strip().splitlines()[-1]
            result["run_id"] = run_id
            if self.settle:
                # The detached watcher starts as `up` ends (imports, N handshakes, N supervisor start-ups);
                # in this lab all of that shares this machine's CPUs with what we measure next.
                w = (json.loads((home / "runs" / run_id / "run.json").read_text()).get("watcher") or {}).get("pid")
                w0, h0, t0 = proc_cpu_ticks(w) if w else 0, live_hosts_cpu(hosts), time.perf_counter()
                time.sleep(self.settle / 2)
                w1, h1, t1 = proc_cpu_ticks(w) if w else 0, live_hosts_cpu(hosts), time.perf_counter()
                time.sleep(self.settle / 2)
                w2, h2, t2 = proc_cpu_ticks(w) if w else 0, live_hosts_cpu(hosts), time.perf_counter()
                result["watcher"] = {"first": ((w1 - w0) / TICK / (t1 - t0), (h1 - h0) / (t1 - t0)),
                                     "second": ((w2 - w1) / TICK / (t2 - t1), (h2 - h1) / (t2 - t1))}
            st = self._timed(argv("status", "--json"), env=env, settle_hosts=hosts)
            result["status"] = st
            tasks = json.loads(st.out) if st.rc == 0 else []
            states = sorted({t["state"] for t in tasks})
            if st.rc != 0 or len(tasks) != n + 1 or states != ["running"]:
                raise BenchError(f"tfctl status: rc {st.rc}, {len(tasks)} tasks (want {n + 1}), states {states}:\n"
                                 + "\n".join(l for _, l in st.lines[-10:]))
        finally:
            problems = []
            try:  # always, even after a failed or interrupted up
                down = self._timed(argv("down"), env=env, settle_hosts=hosts)
                result["down"] = down
                text = "\n".join(l for _, l in down.lines)
                if down.rc != 0 and "no run of" not in text:
                    problems.append(f"tfctl down failed ({down.rc}):\n{text}")
            except BenchError as e:
                problems.append(str(e))
            problems += self.check_clean(home)
            if trace:
                for verb in ("up", "status", "down"):
                    path = home / f"trace-{verb}.json"
                    if path.exists():
                        traces[verb] = json.loads(path.read_text())
                        last = Path(str(path) + ".last")
                        if last.exists():  # main() returned -> every atexit hook done
                            traces[verb]["atexit"] = float(last.read_text()) - traces[verb]["t_start"] \
                                - traces[verb]["end"]
                result["trace"] = traces
            if problems:
                raise BenchError("\n".join(problems))
        return result

    def check_clean(self, home: Path) -> list[str]:
        """No process with a TFCTL_RUN_ID on any lab host, and no detached watcher left running."""
        problems = []
        deadline = time.monotonic() + 5
        while True:
            left = {h.name: [p for p in h.pids() if proc_env_markers(p)[0]] for h in self.lab.hosts}
            left = {k: v for k, v in left.items() if v}
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if left:
            problems.append(f"processes with TFCTL_RUN_ID left on lab hosts: {left} (killed)")
            for pids in left.values():
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        for run_json in (home / "runs").glob("*/run.json"):
            w = json.loads(run_json.read_text()).get("watcher")
            if not w:
                continue
            deadline = time.monotonic() + 5
            while is_same_process(w) and time.monotonic() < deadline:
                time.sleep(0.1)
            if is_same_process(w):
                problems.append(f"detached watcher pid {w['pid']} still running after down (killed)")
                os.kill(w["pid"], signal.SIGKILL)
        return problems


# ============================================================================================
# reporting


def fmt(x: float, digits: int = 2) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def samples_text(xs) -> str:
    return " ".join(f"{x:.2f}" for x in xs)


def up_breakdown(lines: list[tuple[float, str]], n: int, wall: float) -> list[tuple[str, float | None, float, str]]:
    """Milestones of one `up` from its progress lines: (name, tfctl stamp, arrival time, what)."""
    parsed = []
    for at, line in lines:
        m = STAMP.match(line)
        if m:
            parsed.append((float(m.group(1)), at, m.group(2)))

    def find(pattern: str, last: bool = False):
        hits = [(s, a) for s, a, text in parsed if re.search(pattern, text)]
        return (hits[-1] if last else hits[0]) if hits else (None, None)

    first_line = lines[0][0] if lines else None
    steps = [
        ("tfctl started", (None, first_line),
         "interpreter + imports + cluster file + plan (first stderr line)"),
        ("all hosts connected", find(r"ok: python", last=True),
         f"preflight: {n} paramiko handshakes, agent probe/upload, `agent.py info` per host"),
        ("ports checked", find(r"syncing ", last=False), "`agent.py ports` per host"),
        ("synced", find(r"synced: ", last=True), "`agent.py sync_plan` + `sync_apply` per host"),
        ("ps running", find(r"^ps:0\s+running"), "`agent.py start` on host 0"),
        ("ps listening", find(r"^ps:0\s+listening"), "`agent.py status` polls (0.2 s apart) on host 0"),
        ("reachability ok", find(r"reachability: "), f"`agent.py probe` on {n} hosts"),
        ("worker:0 listening", find(r"^worker:0\s+listening"), "`agent.py start` + status polls on host 0"),
        ("all running", find(r"all \d+ tasks running"), f"`agent.py start` for the other {n - 1} workers"),
        ("process exit", (None, wall), "spawn the detached watcher, close connections, exit"),
    ]
    out, prev = [], 0.0
    for name, (stamp, at), what in steps:
        if at is None:
            out.append((name, stamp, float("nan"), float("nan"), what))
            continue
        out.append((name, stamp, at, at - prev, what))
        prev = at
    return out


def trace_summary(trace: dict) -> dict:
    events = trace["events"]
    connects = [e for e in events if e["kind"] == "connect"]
    channels = [e for e in events if e["kind"] in ("exec", "stream")]
    calls = [e for e in events if e["kind"] == "call"]

    def nested(e, inner):
        return sum(i["t1"] - i["t0"] for i in inner if i is not e and i["host"] == e["host"]
                   and i["thread"] == e["thread"] and e["t0"] <= i["t0"] and i["t1"] <= e["t1"])

    # net times: a channel without the handshake it triggered, a call without the channels it opened
    for e in channels:
        e["net"] = e["t1"] - e["t0"] - nested(e, connects)
    for e in calls:
        e["net"] = e["t1"] - e["t0"] - nested(e, channels) - nested(e, [c for c in connects if not any(
            ch["t0"] <= c["t0"] and c["t1"] <= ch["t1"] and ch["thread"] == c["thread"] for ch in channels)])

    def grouped(evs):
        out: dict[str, list[tuple[float, float]]] = {}
        for e in evs:
            out.setdefault(e["label"], []).append((e["net"], e["t1"] - e["t0"]))
        return out

    def per_host(evs):
        out: dict[str, list[str]] = {}
        for e in sorted(evs, key=lambda e: e["t0"]):
            out.setdefault(e["host"], []).append(e["label"])
        return out

    steps = {e["label"]: e["t1"] - e["t0"] for e in events if e["kind"] == "step"}
    return {"connects": connects, "channels": channels, "calls": calls, "calls_by_verb": grouped(calls),
            "channels_by_label": grouped([e for e in channels if e["kind"] == "exec"]),
            "streams_by_label": grouped([e for e in channels if e["kind"] == "stream"]),
            "calls_per_host": per_host(calls), "channels_per_host": per_host(channels),
            "cpu": trace["cpu"], "end": trace["end"], "startup": trace.get("startup", float("nan")),
            "atexit": trace.get("atexit", float("nan")), "steps": steps}


def report_trace(n: int, names: list[str], cycle: dict, label: str, say) -> None:
    tr = cycle.get("trace", {})
    say(f"\n## SSH traffic of one traced up/status/down, N={n}, tfctl {label}\n")
    say("| verb | process wall (s) | start-up + imports / main() / atexit hooks / rest of exit (s) "
        "| controller CPU (s) | handshakes "
        "| handshake median / max (s) | supervisor calls | exec channels | calls per host (host 0 / last) "
        "| channels per host (host 0 / last) |")
    say("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    summaries = {v: trace_summary(tr[v]) for v in ("up", "status", "down") if v in tr}
    for verb, s in summaries.items():
        hs = [c["t1"] - c["t0"] for c in s["connects"]]
        cph, chh = s["calls_per_host"], s["channels_per_host"]
        wall = cycle[verb].wall
        rest = wall - s['startup'] - s['end'] - (s['atexit'] if s['atexit'] == s['atexit'] else 0)
        say(f"| {verb} | {wall:.2f} | {s['startup']:.2f} / {s['end']:.2f} / {fmt(s['atexit'])} / {rest:.2f} "
            f"| {s['cpu']:.2f} | {len(hs)} | {fmt(median(hs))} / "
            f"{fmt(max(hs) if hs else float('nan'))} | {len(s['calls'])} | {len(s['channels'])} | "
            f"{len(cph.get(names[0], []))} / {len(cph.get(names[-1], []))} | "
            f"{len(chh.get(names[0], []))} / {len(chh.get(names[-1], []))} |")
    say("\n| tfctl verb: what | count | net median (s) | net max (s) | net sum (s) | gross median (s) |")
    say("| --- | --- | --- | --- | --- | --- |")
    for verb, s in summaries.items():
        for kind, table in (("supervisor call", s["calls_by_verb"]), ("exec channel", s["channels_by_label"]),
                            ("stream opened", s["streams_by_label"])):
            for label, xs in sorted(table.items(), key=lambda kv: -sum(x[1] for x in kv[1])):
                net, gross = [x[0] for x in xs], [x[1] for x in xs]
                say(f"| {verb}: {kind} `{label}` | {len(xs)} | {median(net):.3f} | {max(net):.3f} | {sum(net):.2f} "
                    f"| {median(gross):.3f} |")
    say("(gross: as the caller waited. net: a supervisor call without the SSH handshakes and channel openings "
        "it triggered -- with one exec per call, all of a call's time is its channel's; with one conversation "
        "per host, the first call on a host still includes the remote interpreter's start-up --, an exec "
        "channel without the handshake it triggered, a stream only until its channel is open.)")
    if "up" in summaries:
        s = summaries["up"]
        for name in dict.fromkeys([names[0], names[-1]]):
            say(f"\nup on {name}: supervisor calls: {', '.join(s['calls_per_host'].get(name, []))}; "
                f"SSH commands: {', '.join(s['channels_per_host'].get(name, []))}")
    for verb, s in summaries.items():
        conn = s["connects"]
        steps = ", ".join(f"{k} {v:.2f}s" for k, v in s["steps"].items())
        if conn:
            say(f"{verb}: handshakes from {min(c['t0'] for c in conn):.2f}s to {max(c['t1'] for c in conn):.2f}s "
                f"after tfctl's main() started" + (f"; {steps}" if steps else ""))


# ============================================================================================
# micro-benchmarks of the fixed costs


def micro(bench: Bench, n: int, reps: int, say) -> None:
    lab = bench.lab
    hosts = lab.hosts[:n]
    env = bench.env
    py = sys.executable

    def wall(argv, times=reps, **kw):
        xs = []
        for _ in range(times):
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, cwd=bench.work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=True, **kw)
            xs.append(time.perf_counter() - t0)
        return median(xs)

    say("\n## Fixed costs (micro-benchmarks, median of %d)\n" % reps)
    say("| what | seconds (wall, median) |")
    say("| --- | --- |")
    say(f"| controller: `python -c pass` | {wall([py, '-c', 'pass']):.3f} |")
    say(f"| controller: `python -c 'import paramiko'` | {wall([py, '-c', 'import paramiko']):.3f} |")
    say(f"| controller: `python -m tfctl --help` | {wall([py, '-m', 'tfctl', '--help']):.3f} |")
    say(f"| controller: `python -c 'import tfctl.cli, tfctl.lifecycle, tfctl.transport.ssh'` | "
        f"{wall([py, '-c', 'import tfctl.cli, tfctl.lifecycle, tfctl.transport.ssh, rich.console']):.3f} |")
    r = subprocess.run([py, "-X", "importtime", "-c", "import tfctl.cli, tfctl.lifecycle, tfctl.transport.ssh, "
                        "rich.console"], env=env, cwd=bench.work, capture_output=True, text=True)
    say(f"| controller: `-X importtime` of those, top-level (ms: {top_imports(r.stderr)}) | "
        f"{sum(us for us, _ in parse_importtime(r.stderr)) / 1e6:.3f} |")
    say(f"| OpenSSH: `ssh -F cfg {hosts[0].name} true` (handshake + 1 exec, C) | "
        f"{wall(lab.ssh_argv(hosts[0], 'true')):.3f} |")

    # paramiko through tfctl's own transport, in this process
    os.environ["TFCTL_HOME"] = str(bench.new_home(0))
    from tfctl.hostagent import HostAgent
    from tfctl.transport.ssh import SSHTransport

    def transport(h):
        return SSHTransport(h.name, ssh_config_path=lab.ssh_config, connect_timeout=10)

    xs, cpus = [], []
    for _ in range(reps):
        t = transport(hosts[0])
        c0, t0 = time.process_time(), time.perf_counter()
        t._transport()
        xs.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        t.close()
    say(f"| paramiko: one handshake (tfctl SSHTransport connect), wall | {median(xs):.3f} |")
    say(f"| paramiko: one handshake, controller CPU | {median(cpus):.3f} |")

    xs, cpus, closes = [], [], []
    for _ in range(reps):
        ts = [transport(h) for h in hosts]
        c0, t0 = time.process_time(), time.perf_counter()
        threads = [threading.Thread(target=t._transport) for t in ts]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        xs.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        t0 = time.perf_counter()
        for t in ts:
            t.close()
        closes.append(time.perf_counter() - t0)
    say(f"| paramiko: {n} handshakes in {n} threads (like tfctl's fan-out), wall | {median(xs):.3f} |")
    say(f"| paramiko: {n} handshakes in {n} threads, controller CPU | {median(cpus):.3f} |")
    say(f"| paramiko: closing those {n} connections one after the other (as Cluster.close does) | "
        f"{median(closes):.3f} |")

    t = transport(hosts[0])
    agent = HostAgent(t, py, "~/.tfctl")
    agent.call("ports", {"ports": [1]})  # connect + agent upload if needed
    agent_path = agent._agent()

    def chan(what, command, stdin=None, times=reps * 4):
        """Median wall of one exec channel, and the host CPU per call (the live session's sshd
        reaps each command, so its children's counters grow by exactly what the command used)."""
        xs = []
        c0 = live_hosts_cpu(hosts[:1])
        for _ in range(times):
            t0 = time.perf_counter()
            r = t.run(command, stdin=stdin, timeout=60)
            xs.append(time.perf_counter() - t0)
            if not r.ok:
                raise BenchError(f"{command}: {r.exit_code} {r.stderr}")
        cpu = (live_hosts_cpu(hosts[:1]) - c0) / times
        say(f"| paramiko, open connection: {what} | {median(xs):.3f} (host CPU {cpu:.3f}) |")

    req = json.dumps({"root": "~/.tfctl", "ports": [PS_PORT]}).encode()
    status_req = json.dumps({"root": "~/.tfctl", "run_id": "none", "tasks": {"worker:0": WORKER_PORT}}).encode()
    chan("exec channel `true` (round trip: sshd forks, the shell runs)", "true")
    chan("exec `python -c pass`", f"{py} -c pass")
    chan("exec `python -I -S -c pass` (no site)", f"{py} -I -S -c pass")
    chan("exec `python agent.py ports` (a one-shot supervisor call)", f"{py} {agent_path} ports", stdin=req)
    chan("exec `python -I -S agent.py ports`", f"{py} -I -S {agent_path} ports", stdin=req)
    chan("exec `python agent.py status` (1 task)", f"{py} {agent_path} status", stdin=status_req)
    chan("exec `python agent.py info` (python = its own interpreter)", f"{py} {agent_path} info",
         stdin=json.dumps({"root": "~/.tfctl", "python": py}).encode())
    xs = []
    for _ in range(reps * 3):
        t0 = time.perf_counter()
        agent.call("ports", {"ports": [PS_PORT]})
        xs.append(time.perf_counter() - t0)
    say(f"| tfctl `HostAgent.call('ports')` on a warm agent (as the source tree under test does it) "
        f"| {median(xs):.3f} |")

    # the same N supervisor calls at once over N open connections (one status fan-out)
    ts = [transport(h) for h in hosts]
    agents = [HostAgent(x, py, "~/.tfctl") for x in ts]
    threads = [threading.Thread(target=a.call, args=("ports", {"ports": [1]})) for a in agents]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    xs, cpus = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        threads = [threading.Thread(target=a.call, args=("ports", {"ports": [1]})) for a in agents]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        xs.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    say(f"| tfctl: {n} `HostAgent.call('ports')` at once on {n} warm agents (one fan-out), wall | {median(xs):.3f} |")
    say(f"| tfctl: same fan-out, controller CPU | {median(cpus):.3f} |")
    for a in [agent, *agents]:
        getattr(a, "close", a.transport.close)()

    # the agent's interpreter start-up on a host, without SSH (nsenter into host 0)
    h = hosts[0]
    xs = []
    for _ in range(reps * 3):
        t0 = time.perf_counter()
        h.exec([py, "-c", "pass"], env={"HOME": h.home, "PATH": os.environ["PATH"]})
        xs.append(time.perf_counter() - t0)
    say(f"| on host 0 without SSH: nsenter + `python -c pass` | {median(xs):.3f} |")
    r = h.exec([py, "-X", "importtime", os.path.expanduser(agent_path.replace("~", h.home, 1)), "ports"],
               input=req.decode(), env={"HOME": h.home, "PATH": os.environ["PATH"]})
    total = sum(us for us, _ in parse_importtime(r.stderr))
    say(f"| on host 0: `python -X importtime agent.py ports`: top-level imports total (ms: "
        f"{top_imports(r.stderr)}) | {total / 1e6:.3f} |")


def parse_importtime(stderr: str) -> list[tuple[int, str]]:
    """(cumulative microseconds, module) of each top-level import in `-X importtime` output."""
    imports = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m.group(3)) <= 3:  # "| " + two spaces per level
            imports.append((int(m.group(2)), m.group(4)))
    return imports


def top_imports(stderr: str, k: int = 6) -> str:
    return ", ".join(f"{name} {us / 1000:.0f}" for us, name in sorted(parse_importtime(stderr), reverse=True)[:k])


# ============================================================================================


def tree_label(src: Path) -> str:
    """A tfctl tree's name in the report: its commit (+ "dirty") in a git checkout, else its directory."""
    git = lambda *a: subprocess.run(["git", "-C", str(src), *a], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") if (src / ".git").exists() else ""
    if not head:
        return src.name
    dirty = git("status", "--porcelain", "--", "tfctl")
    return head + ("+uncommitted" if dirty else "")


VERBS3 = ("up", "status", "down")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[4, 16], help="cluster sizes (default: 4 16)")
    ap.add_argument("--repeat", type=int, default=3, help="timed repetitions per measurement (default 3)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed rounds per size first (agent upload, code sync, page cache; default 1)")
    ap.add_argument("--src", default=str(REPO),
                    help="tfctl source tree to benchmark (default: this repo)")
    ap.add_argument("--compare", action="append", default=[], metavar="DIR",
                    help="another tfctl source tree (e.g. `git archive COMMIT tfctl | tar -x -C DIR`) measured in "
                         "the same rounds, interleaved, for a fair before/after under the same load; repeatable")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds between `up -d` and `status`, so the detached watcher's start-up burst is "
                         "over (default 2; 0 = back to back)")
    ap.add_argument("--no-trace", action="store_true", help="skip the traced extra up/status/down")
    ap.add_argument("--no-micro", action="store_true", help="skip the fixed-cost micro-benchmarks")
    ap.add_argument("--keep", action="store_true", help="keep the bench workdir (lab keys, logs, homes)")
    args = ap.parse_args()
    sizes = sorted(set(args.hosts))
    if sizes[0] < 1 or sizes[-1] > 200 or args.repeat < 1:
        ap.error("host counts must be 1..200 and --repeat >= 1")
    trees = [SRC] + [Path(d).resolve() for d in args.compare]
    for tree in trees:
        if not (tree / "tfctl" / "__main__.py").exists():
            ap.error(f"{tree} holds no tfctl package (tfctl/__main__.py)")
    labels = {tree: tree_label(tree) for tree in trees}
    reason = skip_reason()
    if reason:
        print(f"cannot create the host lab here: {reason}", file=sys.stderr)
        return 2
    for tool in ("pdsh", "ssh"):
        if shutil.which(tool) is None:
            print(f"`{tool}` not found", file=sys.stderr)
            return 2

    def say(text: str = "") -> None:
        print(text, flush=True)

    work = Path(tempfile.mkdtemp(prefix="tfctl-bench-"))
    t_begin = time.monotonic()
    ssh_version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    say("# tfctl fan-out benchmark")
    say(f"\n{os.cpu_count()} CPUs; load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"python {sys.version.split()[0]} ({sys.executable}); {ssh_version}")
    for tree in trees:
        say(f"tfctl {'under test' if tree == SRC else 'compared'}: {labels[tree]} ({tree})")
    say(f"sizes {sizes}, {args.repeat} timed repetitions (median reported), {args.warmup} warm-up round(s) per "
        f"size, {args.settle:g}s between `up -d` and `status`")
    ok = True
    try:
        lab = TestHostLab(sizes[-1], workdir=work / "lab", prefix=PREFIX, bridge=BRIDGE, subnet=SUBNET)
        with lab:
            say(f"lab: {sizes[-1]} hosts {lab.hosts[0].name}..{lab.hosts[-1].name} on {SUBNET}.0/24 "
                f"(created in {lab.timings['create']:.2f}s)")
            bench = Bench(lab, work)
            bench.settle = args.settle
            for tree in trees:
                where = subprocess.run([sys.executable, "-c", "import tfctl; print(tfctl.__file__)"],
                                       env=bench.env_for(tree), cwd=work, capture_output=True, text=True).stdout.strip()
                if not where.startswith(str(tree)):
                    raise BenchError(f"`python -m tfctl` would import {where}, not the tree in {tree}")
            floor: dict[int, dict[str, list[Sample]]] = {}
            rows: dict[Path, dict[int, dict[str, list[Sample]]]] = {t: {} for t in trees}
            cold: dict[Path, dict[int, dict[str, float]]] = {t: {} for t in trees}
            traces: dict[Path, dict[int, dict]] = {t: {} for t in trees}
            watch: dict[Path, dict[int, list]] = {t: {} for t in trees}
            for n in sizes:
                floor[n] = {"pdsh": [], "seq": []}
                for tree in trees:
                    rows[tree][n] = {k: [] for k in VERBS3}
                for _ in range(args.warmup):
                    bench.pdsh(n)
                    for tree in trees:
                        c = bench.tfctl_cycle(n, src=tree)
                        cold[tree].setdefault(n, {k: c[k].wall for k in VERBS3 if k in c})
                for r in range(args.repeat):
                    floor[n]["pdsh"].append(bench.pdsh(n))
                    floor[n]["seq"].append(bench.sequential_ssh(n))
                    text = [f"pdsh {floor[n]['pdsh'][-1].wall:.2f}s, seq ssh {floor[n]['seq'][-1].wall:.2f}s"]
                    for tree in (trees if r % 2 == 0 else trees[::-1]):  # alternate the order between rounds
                        c = bench.tfctl_cycle(n, src=tree)
                        for k in VERBS3:
                            rows[tree][n][k].append(c[k])
                        if "watcher" in c:
                            watch[tree].setdefault(n, []).append(c["watcher"])
                        text.append(f"{labels[tree] + ' ' if len(trees) > 1 else ''}up {c['up'].wall:.2f}s, "
                                    f"status {c['status'].wall:.2f}s, down {c['down'].wall:.2f}s")
                    say(f"  N={n} round {r + 1}: " + "; ".join(text) + f" (load {os.getloadavg()[0]:.2f})")
                if not args.no_trace:
                    for tree in trees:
                        traces[tree][n] = bench.tfctl_cycle(n, trace=True, src=tree)

            def med(samples):
                return median([x.wall for x in samples])

            tn = TARGET_N if TARGET_N in sizes else sizes[-1]
            for tree in trees:
                say(f"\n## Wall time, median of {args.repeat} (seconds), tfctl {labels[tree]}\n")
                say("| N | pdsh true (s) | sequential ssh (s) | tfctl up (s) | tfctl status (s) | tfctl down (s) "
                    "| up/pdsh | status/pdsh | down/pdsh |")
                say("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
                for n in sizes:
                    p, q = med(floor[n]["pdsh"]), med(floor[n]["seq"])
                    m = {k: med(rows[tree][n][k]) for k in VERBS3}
                    say(f"| {n} | {p:.2f} | {q:.2f} | {m['up']:.2f} | {m['status']:.2f} | {m['down']:.2f} | "
                        f"{m['up'] / p:.2f}x | {m['status'] / p:.2f}x | {m['down'] / p:.2f}x |")
                say(f"\nTargets at N={tn}" + ("" if tn == TARGET_N else f" (N={TARGET_N} not measured)") + ":")
                p = med(floor[tn]["pdsh"])
                for verb, limit in TARGETS.items():
                    v = med(rows[tree][tn][verb])
                    say(f"- {verb}: {v:.2f}s = {v / p:.2f}x pdsh ({p:.2f}s); target <= {limit:g}x: "
                        f"{'MET' if v / p <= limit else 'NOT MET'}")

            say("\nAll samples (s):")
            for n in sizes:
                say(f"  N={n}: pdsh [{samples_text([x.wall for x in floor[n]['pdsh']])}]; "
                    f"seq [{samples_text([x.wall for x in floor[n]['seq']])}]")
                for tree in trees:
                    say(f"  N={n} {labels[tree]}: " + "; ".join(
                        f"{k} [{samples_text([x.wall for x in rows[tree][n][k]])}]" for k in VERBS3))
            if args.warmup:
                say("Warm-up round (first contact: agent upload and code sync to hosts not used before; "
                    "not in the medians):")
                for tree in trees:
                    say(f"  {labels[tree]}: " + "; ".join(
                        f"N={n} " + ", ".join(f"{k} {v:.2f}s" for k, v in c.items()) for n, c in cold[tree].items()))

            say("\n## CPU seconds, median (ctl = the command and its children on the controller; hosts = sshd "
                "sessions, shells and supervisor processes reaped on the lab hosts, all of which share this "
                "machine's CPUs)\n")
            say("| N | tfctl | pdsh ctl | pdsh hosts | seq ssh ctl | seq ssh hosts | up ctl | up hosts | status ctl "
                "| status hosts | down ctl | down hosts |")
            say("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for n in sizes:
                cells = []
                for k in ("pdsh", "seq"):
                    cells += [fmt(median([x.cpu for x in floor[n][k]])), fmt(median([x.host_cpu for x in floor[n][k]]))]
                for tree in trees:
                    more = []
                    for k in VERBS3:
                        more += [fmt(median([x.cpu for x in rows[tree][n][k]])),
                                 fmt(median([x.host_cpu for x in rows[tree][n][k]]))]
                    say(f"| {n} | {labels[tree]} | " + " | ".join(cells + more) + " |")
            say("(A host's sshd only adds a session's CPU once the connection closes: `up`'s count misses the "
                "task and monitor processes, still running; `down`'s includes them and the detached watcher's "
                "work since `up`.)")
            if any(watch[t] for t in trees):
                say("\nDetached watcher after `up -d`, CPU seconds per second (median), in the first and second "
                    f"half of the {args.settle:g}s pause: the watcher process itself / everything on the lab hosts "
                    "(its sessions and supervisors, the tasks and their monitors):")
                for tree in trees:
                    for n, ws in watch[tree].items():
                        f = [median([w[k][i] for w in ws]) for k in ("first", "second") for i in (0, 1)]
                        say(f"  {labels[tree]} N={n}: first {f[0]:.2f} / {f[1]:.2f}, then {f[2]:.2f} / {f[3]:.2f}")

            for tree in trees:
                for n in sizes:
                    ups = sorted(rows[tree][n]["up"], key=lambda x: x.wall)
                    sample = ups[len(ups) // 2]
                    say(f"\n## Where one `up` spends its time, N={n}, tfctl {labels[tree]} (the median run, "
                        f"{sample.wall:.2f}s)\n")
                    say("| milestone | tfctl stamp (s) | at (s) | step (s) | what the step did |")
                    say("| --- | --- | --- | --- | --- |")
                    for name, stamp, at, step, what in up_breakdown(sample.lines, n, sample.wall):
                        say(f"| {name} | {'-' if stamp is None else f'{stamp:.1f}'} | {fmt(at)} | {fmt(step)} "
                            f"| {what} |")
                say("(at: when the line reached this benchmark, counted from spawning `python -m tfctl`; tfctl's "
                    "own stamp counts from after its start-up, with 0.1 s resolution.)")

            for tree in trees:
                for n, c in traces[tree].items():
                    report_trace(n, [h.name for h in lab.hosts[:n]], c, labels[tree], say)

            if not args.no_micro:
                micro(bench, sizes[-1], max(3, args.repeat), say)

            left = {h.name: [p for p in h.pids() if proc_env_markers(p)[0]] for h in lab.hosts}
            left = {k: v for k, v in left.items() if v}
            if left:
                ok = False
                say(f"\nLEFT RUNNING on lab hosts: {left}")
            else:
                say(f"\nclean: no process with TFCTL_RUN_ID on any of the {len(lab.hosts)} lab hosts")
    except BenchError as e:
        ok = False
        say(f"\nBENCH FAILED: {e}")
    finally:
        if args.keep:
            say(f"workdir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    say(f"lab removed; load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"benchmark took {time.monotonic() - t_begin:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
