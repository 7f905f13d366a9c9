"""Micro-benchmarks of the fixed costs under one tfctl command: interpreter and imports, one
handshake, one exec channel, one supervisor call, on the controller and on a lab host.

These drive tfctl's SSH transport and HostAgent in this process (the tree under test, first on
sys.path), so each row is one cost alone, without the rest of a command around it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from lab import PS_PORT, WORKER_PORT, Bench, BenchError, live_hosts_cpu
from netns_hosts import TestHost
from report import Say, median

PY = sys.executable
CONTROLLER_IMPORTS = "import tfctl.cli, tfctl.lifecycle, tfctl.transport.ssh, rich.console"


def micro(bench: Bench, n: int, reps: int, say: Say) -> None:
    """The fixed-costs table, on the first n lab hosts; each row a median of `reps` or more."""
    say(f"\n## Fixed costs (micro-benchmarks, median of {reps})\n")
    say("| what | seconds (wall, median) |")
    say("| --- | --- |")
    controller_costs(bench, reps, say)
    os.environ["TFCTL_HOME"] = str(bench.new_home(0))  # for the transports made in this process
    handshake_costs(bench, n, reps, say)
    agent_path = channel_costs(bench, n, reps, say)
    host_costs(bench.lab.hosts[0], agent_path, reps, say)


def in_threads(calls: list[Callable[[], Any]]) -> None:
    """Run the calls at once, one thread each, as tfctl fans out."""
    threads = [threading.Thread(target=c) for c in calls]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def controller_costs(bench: Bench, reps: int, say: Say) -> None:
    def wall(argv: list[str]) -> float:
        xs = []
        for _ in range(reps):
            t0 = time.perf_counter()
            subprocess.run(
                argv, env=bench.env, cwd=bench.work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
            )
            xs.append(time.perf_counter() - t0)
        return median(xs)

    say(f"| controller: `python -c pass` | {wall([PY, '-c', 'pass']):.3f} |")
    say(f"| controller: `python -c 'import paramiko'` | {wall([PY, '-c', 'import paramiko']):.3f} |")
    say(f"| controller: `python -m tfctl --help` | {wall([PY, '-m', 'tfctl', '--help']):.3f} |")
    say(f"| controller: `python -c '{CONTROLLER_IMPORTS}'` | {wall([PY, '-c', CONTROLLER_IMPORTS]):.3f} |")
    r = subprocess.run(
        [PY, "-X", "importtime", "-c", CONTROLLER_IMPORTS],
        env=bench.env,
        cwd=bench.work,
        capture_output=True,
        text=True,
    )
    say(
        f"| controller: `-X importtime` of those, top-level (ms: {top_imports(r.stderr)}) | "
        f"{sum(us for us, _ in parse_importtime(r.stderr)) / 1e6:.3f} |"
    )
    h0 = bench.lab.hosts[0]
    say(
        f"| OpenSSH: `ssh -F cfg {h0.name} true` (handshake + 1 exec, C) | {wall(bench.lab.ssh_argv(h0, 'true')):.3f} |"
    )


def handshake_costs(bench: Bench, n: int, reps: int, say: Say) -> None:
    """paramiko handshakes through tfctl's own transport: one, then n at once."""
    xs, cpus = [], []
    for _ in range(reps):
        t = transport(bench, bench.lab.hosts[0])
        c0, t0 = time.process_time(), time.perf_counter()
        t._transport()  # connect only: no channel
        xs.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        t.close()
    say(f"| paramiko: one handshake (tfctl SSHTransport connect), wall | {median(xs):.3f} |")
    say(f"| paramiko: one handshake, controller CPU | {median(cpus):.3f} |")
    xs, cpus, closes = [], [], []
    for _ in range(reps):
        ts = [transport(bench, h) for h in bench.lab.hosts[:n]]
        c0, t0 = time.process_time(), time.perf_counter()
        in_threads([t._transport for t in ts])
        xs.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        t0 = time.perf_counter()
        for t in ts:
            t.close()
        closes.append(time.perf_counter() - t0)
    say(f"| paramiko: {n} handshakes in {n} threads (like tfctl's fan-out), wall | {median(xs):.3f} |")
    say(f"| paramiko: {n} handshakes in {n} threads, controller CPU | {median(cpus):.3f} |")
    say(
        f"| paramiko: closing those {n} connections one after the other (as Cluster.close does) | "
        f"{median(closes):.3f} |"
    )


def transport(bench: Bench, h: TestHost) -> Any:
    from tfctl.transport.ssh import SSHTransport

    return SSHTransport(h.name, ssh_config_path=bench.lab.ssh_config, connect_timeout=10)


def channel_costs(bench: Bench, n: int, reps: int, say: Say) -> str:
    """Exec channels and supervisor calls on open connections; returns the agent's path on the hosts."""
    from tfctl.hostagent import HostAgent

    hosts = bench.lab.hosts[:n]
    t = transport(bench, hosts[0])
    agent = HostAgent(t, PY, "~/.tfctl")
    agent.call("ports", {"ports": [1]})  # connect + agent upload if needed
    agent_path = agent._agent()

    def chan(what: str, command: str, stdin: bytes | None = None) -> None:
        """Median wall of one exec channel, and the host CPU per call (the live session's sshd
        reaps each command, so its children's counters grow by exactly what the command used)."""
        xs, times = [], reps * 4
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
    chan("exec `python -c pass`", f"{PY} -c pass")
    chan("exec `python -I -S -c pass` (no site)", f"{PY} -I -S -c pass")
    chan("exec `python agent.py ports` (a one-shot supervisor call)", f"{PY} {agent_path} ports", stdin=req)
    chan("exec `python -I -S agent.py ports`", f"{PY} -I -S {agent_path} ports", stdin=req)
    chan("exec `python agent.py status` (1 task)", f"{PY} {agent_path} status", stdin=status_req)
    chan(
        "exec `python agent.py info` (python = its own interpreter)",
        f"{PY} {agent_path} info",
        stdin=json.dumps({"root": "~/.tfctl", "python": PY}).encode(),
    )
    xs = []
    for _ in range(reps * 3):
        t0 = time.perf_counter()
        agent.call("ports", {"ports": [PS_PORT]})
        xs.append(time.perf_counter() - t0)
    say(
        f"| tfctl `HostAgent.call('ports')` on a warm agent (as the source tree under test does it) "
        f"| {median(xs):.3f} |"
    )

    # the same n supervisor calls at once over n open connections (one status fan-out)
    agents = [HostAgent(transport(bench, h), PY, "~/.tfctl") for h in hosts]
    fan_out = [lambda a=a: a.call("ports", {"ports": [1]}) for a in agents]
    in_threads(fan_out)  # connect, and start each host's conversation
    xs, cpus = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        in_threads(fan_out)
        xs.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    say(f"| tfctl: {n} `HostAgent.call('ports')` at once on {n} warm agents (one fan-out), wall | {median(xs):.3f} |")
    say(f"| tfctl: same fan-out, controller CPU | {median(cpus):.3f} |")
    for a in [agent, *agents]:
        a.close()
    return agent_path


def host_costs(h: TestHost, agent_path: str, reps: int, say: Say) -> None:
    """The agent's interpreter start-up on a host, without SSH (nsenter into the host)."""
    env = {"HOME": h.home, "PATH": os.environ["PATH"]}
    xs = []
    for _ in range(reps * 3):
        t0 = time.perf_counter()
        h.exec([PY, "-c", "pass"], env=env)
        xs.append(time.perf_counter() - t0)
    say(f"| on host 0 without SSH: nsenter + `python -c pass` | {median(xs):.3f} |")
    req = json.dumps({"root": "~/.tfctl", "ports": [PS_PORT]})
    r = h.exec([PY, "-X", "importtime", agent_path.replace("~", h.home, 1), "ports"], input=req, env=env)
    total = sum(us for us, _ in parse_importtime(r.stderr))
    say(
        f"| on host 0: `python -X importtime agent.py ports`: top-level imports total (ms: "
        f"{top_imports(r.stderr)}) | {total / 1e6:.3f} |"
    )


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
