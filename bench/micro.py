"""Micro-benchmarks of the fixed costs under one tfctl command: interpreter and imports, one
handshake, one exec channel, one supervisor call, on the controller and on a lab host.

These drive tfctl's SSH transport and HostAgent in this process (the tree under test, first on
sys.path), so each row is one cost alone, without the rest of a command around it. The supervisor
is the zipapp `~/.tfctl/supervisor-<hash>.pyz` (tfctl/supervisor/bundle.py), started on a host as
`python -I -S <pyz> serve` and fed one request envelope per line on stdin (tfctl/hostagent.py);
a tree under test without it (before the supervisor package) gets the rows that do not need it.
The last table measures every tree's supervisor start-up, --compare trees included, whatever its
form (the zipapp, or the older single-file `tfctl/supervisor/agent.py`).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import posixpath
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.lab import PS_PORT, WORKER_PORT, Bench, BenchError, live_hosts_cpu
from bench.netns_hosts import TestHost
from bench.report import Say, median

PY = sys.executable
CONTROLLER_IMPORTS = "import tfctl.cli, tfctl.controller.live.driver, tfctl.transport.ssh, rich.console"
# a tree's supervisor as a file, built in that tree's own interpreter environment (its PYTHONPATH)
BUILD_PYZ = "import sys; from tfctl.supervisor import bundle; sys.stdout.buffer.write(bundle.artifact()[1])"


def micro(bench: Bench, n: int, reps: int, say: Say, trees: list[Path] | None = None) -> None:
    """The fixed-costs tables, on the first n lab hosts; each row a median of `reps` or more.

    `trees`: the tfctl trees whose supervisor start-up is compared in the last table (default:
    --src and every --compare of this process's command line).
    """
    say(f"\n## Fixed costs (micro-benchmarks, median of {reps})\n")
    say("| what | seconds (wall, median) |")
    say("| --- | --- |")
    controller_costs(bench, reps, say)
    os.environ["TFCTL_HOME"] = str(bench.new_home(0))  # for the transports made in this process
    handshake_costs(bench, n, reps, say)
    missing = typed_supervisor_missing()
    if missing:
        say(f"| (supervisor rows skipped: the tree under test has no zipapp supervisor: {missing}) | - |")
    else:
        pyz = channel_costs(bench, n, reps, say)
        host_costs(bench.lab.hosts[0], pyz, reps, say)
    startup_costs(bench, trees if trees is not None else trees_from_argv(), reps, say)


def typed_supervisor_missing() -> str:
    """Why the tree under test cannot run the supervisor rows ('' if it can)."""
    try:
        import tfctl.cluster.agent as hostagent
        from tfctl.supervisor import bundle, protocol
    except ImportError as e:
        return str(e)
    for module, name in (
        (bundle, "artifact"),
        (protocol, "envelope"),
        (protocol, "PortsRequest"),
        (hostagent, "REMOTE_ROOT"),
    ):
        if not hasattr(module, name):
            return f"{module.__name__}.{name} not found"
    return ""


def trees_from_argv() -> list[Path]:
    """--src (default: this repo) and the --compare trees, as fanout.py reads them."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--src", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--compare", action="append", default=[])
    args, _ = ap.parse_known_args()
    return [Path(d).resolve() for d in [args.src, *args.compare]]


def in_threads(calls: Sequence[Callable[[], object]]) -> None:
    """Run the calls at once, one thread each, as tfctl fans out."""
    threads = [threading.Thread(target=c) for c in calls]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def wall(bench: Bench, argv: list[str], reps: int, env: dict[str, str] | None = None) -> float:
    """Median wall of running argv on the controller (in the scratch dir, stdin empty)."""
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run(
            argv,
            env=env or bench.env,
            cwd=bench.work,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        xs.append(time.perf_counter() - t0)
    return median(xs)


def controller_costs(bench: Bench, reps: int, say: Say) -> None:
    say(f"| controller: `python -c pass` | {wall(bench, [PY, '-c', 'pass'], reps):.3f} |")
    say(f"| controller: `python -c 'import paramiko'` | {wall(bench, [PY, '-c', 'import paramiko'], reps):.3f} |")
    say(f"| controller: `python -m tfctl --help` | {wall(bench, [PY, '-m', 'tfctl', '--help'], reps):.3f} |")
    say(f"| controller: `python -c '{CONTROLLER_IMPORTS}'` | {wall(bench, [PY, '-c', CONTROLLER_IMPORTS], reps):.3f} |")
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
        f"| OpenSSH: `ssh -F cfg {h0.name} true` (handshake + 1 exec, C) | "
        f"{wall(bench, bench.lab.ssh_argv(h0, 'true'), reps):.3f} |"
    )


def handshake_costs(bench: Bench, n: int, reps: int, say: Say) -> None:
    """paramiko handshakes through tfctl's own transport: one, then n at once."""
    from tfctl.transport import ssh

    connect = getattr(ssh, "connect", None)  # the handshake alone, no channel; older trees lack it
    if connect is None:
        say("| (handshake rows skipped: the tree under test has no tfctl.transport.ssh.connect) | - |")
        return
    xs, cpus = [], []
    for _ in range(reps):
        t = transport(bench, bench.lab.hosts[0])
        c0, t0 = time.process_time(), time.perf_counter()
        connect(t)
        xs.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        t.close()
    say(f"| paramiko: one handshake (tfctl SSHTransport connect), wall | {median(xs):.3f} |")
    say(f"| paramiko: one handshake, controller CPU | {median(cpus):.3f} |")
    xs, cpus, closes = [], [], []
    for _ in range(reps):
        ts = [transport(bench, h) for h in bench.lab.hosts[:n]]
        c0, t0 = time.process_time(), time.perf_counter()
        in_threads([functools.partial(connect, t) for t in ts])
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


def envelope_line(request: Any) -> bytes:
    """One request as the supervisor reads it on stdin: its envelope, one JSON line."""
    from tfctl.cluster.agent import REMOTE_ROOT
    from tfctl.supervisor.protocol import envelope

    return (json.dumps(envelope(uuid.uuid4().hex, REMOTE_ROOT, request).to_wire()) + "\n").encode()


def answered(stdout: str) -> bool:
    """The supervisor's last line is an `ok` answer (an error answer still exits 0)."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    try:
        return bool(lines) and "ok" in json.loads(lines[-1])
    except ValueError:
        return False


def chan(
    t: Any,
    h: TestHost,
    reps: int,
    say: Say,
    what: str,
    command: str,
    stdin: bytes | None = None,
    expect: Callable[[str], bool] | None = None,
) -> None:
    """Median wall of one exec channel on the open connection `t` to `h`, and the host CPU per
    call (the live session's sshd reaps each command, so its children's counters grow by exactly
    what the command used). `expect(stdout)` must hold for every call."""
    xs, times = [], reps * 4
    c0 = live_hosts_cpu([h])
    for _ in range(times):
        t0 = time.perf_counter()
        r = t.run(command, stdin=stdin, timeout=60)
        xs.append(time.perf_counter() - t0)
        if not r.ok or (expect is not None and not expect(r.stdout)):
            raise BenchError(f"{command}: exit {r.exit_code}, stdout {r.stdout[-300:]!r}, stderr {r.stderr[-300:]!r}")
    cpu = (live_hosts_cpu([h]) - c0) / times
    say(f"| paramiko, open connection: {what} | {median(xs):.3f} (host CPU {cpu:.3f}) |")


def channel_costs(bench: Bench, n: int, reps: int, say: Say) -> str:
    """Exec channels and supervisor calls on open connections; returns the zipapp's path on the hosts."""
    from tfctl.cluster.agent import REMOTE_ROOT, HostAgent
    from tfctl.supervisor import bundle
    from tfctl.supervisor.protocol import InfoRequest, PortsRequest, StatusRequest
    from tfctl.transport.base import shell_path

    hosts = bench.lab.hosts[:n]
    h0 = hosts[0]
    t = transport(bench, h0)
    agent = HostAgent(t, PY, REMOTE_ROOT)
    agent.call(PortsRequest([1]))  # connect, and ship the zipapp if host 0 lacks it
    pyz = posixpath.join(REMOTE_ROOT, f"supervisor-{bundle.artifact()[0]}.pyz")  # as HostAgent names it
    if not t.run(f"test -f {shell_path(pyz)}").ok:
        raise BenchError(f"{pyz} is not on {h0.name} after a supervisor call: does HostAgent name it otherwise now?")
    q, py = shell_path(pyz), shell_path(PY)
    ports = envelope_line(PortsRequest([PS_PORT]))

    chan(t, h0, reps, say, "exec channel `true` (round trip: sshd forks, the shell runs)", "true")
    chan(t, h0, reps, say, "exec `python -c pass`", f"{py} -c pass")
    chan(t, h0, reps, say, "exec `python -I -S -c pass` (no site)", f"{py} -I -S -c pass")
    chan(
        t,
        h0,
        reps,
        say,
        "exec `python -I -S <pyz> serve` < no request (supervisor start-up + exit)",
        f"{py} -I -S {q} serve",
        stdin=b"",
        expect=lambda out: out == "",
    )
    chan(
        t,
        h0,
        reps,
        say,
        "exec `python -I -S <pyz> serve` < one `ports` envelope (a one-shot supervisor call)",
        f"{py} -I -S {q} serve",
        stdin=ports,
        expect=answered,
    )
    chan(
        t,
        h0,
        reps,
        say,
        "exec `python <pyz> serve` < one `ports` envelope (with site)",
        f"{py} {q} serve",
        stdin=ports,
        expect=answered,
    )
    chan(
        t,
        h0,
        reps,
        say,
        "exec `python -I -S <pyz> serve` < one `status` envelope (1 task)",
        f"{py} -I -S {q} serve",
        stdin=envelope_line(StatusRequest(run_id="none", tasks={"worker:0": WORKER_PORT})),
        expect=answered,
    )
    chan(
        t,
        h0,
        reps,
        say,
        "exec `python -I -S <pyz> serve` < one `info` envelope (python = its own interpreter)",
        f"{py} -I -S {q} serve",
        stdin=envelope_line(InfoRequest(python=PY)),
        expect=answered,
    )
    xs = []
    for _ in range(reps * 3):
        t0 = time.perf_counter()
        agent.call(PortsRequest([PS_PORT]))
        xs.append(time.perf_counter() - t0)
    say(
        f"| tfctl `HostAgent.call(PortsRequest)` on a warm agent (one envelope on its `serve` conversation) "
        f"| {median(xs):.3f} |"
    )

    # the same n supervisor calls at once over n open connections (one status fan-out)
    agents = [HostAgent(transport(bench, h), PY, REMOTE_ROOT) for h in hosts]
    fan_out = [functools.partial(a.call, PortsRequest([1])) for a in agents]
    in_threads(fan_out)  # connect, and start each host's conversation
    xs, cpus = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        in_threads(fan_out)
        xs.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    say(f"| tfctl: {n} `HostAgent.call(PortsRequest)` at once on {n} warm agents, wall | {median(xs):.3f} |")
    say(f"| tfctl: same fan-out, controller CPU | {median(cpus):.3f} |")
    for a in [agent, *agents]:
        a.close()
    return pyz


def host_costs(h: TestHost, pyz: str, reps: int, say: Say) -> None:
    """The supervisor's interpreter start-up on a host, without SSH (nsenter into the host)."""
    from tfctl.supervisor.protocol import PortsRequest

    env = {"HOME": h.home, "PATH": os.environ["PATH"]}
    local = pyz.replace("~", h.home, 1)

    def host_wall(argv: list[str], stdin: str = "") -> float:
        xs = []
        for _ in range(reps * 3):
            t0 = time.perf_counter()
            r = h.exec(argv, input=stdin, env=env, cwd=h.home)
            xs.append(time.perf_counter() - t0)
            if r.returncode != 0:
                raise BenchError(f"on {h.name}: {argv}: exit {r.returncode}: {r.stderr[-300:]}")
        return median(xs)

    say(f"| on host 0 without SSH: nsenter + `python -c pass` | {host_wall([PY, '-c', 'pass']):.3f} |")
    say(
        f"| on host 0 without SSH: nsenter + `python -I -S <pyz> serve` < no request | "
        f"{host_wall([PY, '-I', '-S', local, 'serve']):.3f} |"
    )
    r = h.exec(
        [PY, "-X", "importtime", "-I", "-S", local, "serve"],
        input=envelope_line(PortsRequest([PS_PORT])).decode(),
        env=env,
        cwd=h.home,
    )
    if r.returncode != 0 or not answered(r.stdout):
        raise BenchError(f"on {h.name}: -X importtime of {local}: exit {r.returncode}: {r.stderr[-300:]}")
    total = sum(us for us, _ in parse_importtime(r.stderr))
    say(
        f"| on host 0: `python -X importtime -I -S <pyz> serve` < one `ports` envelope: top-level imports "
        f"total (ms: {top_imports(r.stderr)}) | {total / 1e6:.3f} |"
    )


def supervisor_file(bench: Bench, tree: Path, into: Path) -> tuple[str, Path]:
    """A tree's supervisor as one file on the shared disk (the hosts see it at the same path):
    its zipapp, built by that tree's own bundle module, or the older single `agent.py`."""
    if (tree / "tfctl" / "supervisor" / "bundle.py").exists():
        r = subprocess.run([PY, "-c", BUILD_PYZ], env=bench.env_for(tree), cwd=bench.work, capture_output=True)
        if r.returncode != 0 or not r.stdout:
            raise BenchError(f"building {tree}'s supervisor zipapp failed: {r.stderr.decode()[-300:]}")
        into.mkdir(parents=True, exist_ok=True)
        path = into / f"supervisor-{hashlib.sha256(r.stdout).hexdigest()[:16]}.pyz"
        path.write_bytes(r.stdout)
        return "zipapp", path
    agent = tree / "tfctl" / "supervisor" / "agent.py"
    if agent.exists():
        return "agent.py", agent
    raise BenchError(f"{tree} has neither tfctl/supervisor/bundle.py nor tfctl/supervisor/agent.py")


def startup_costs(bench: Bench, trees: list[Path], reps: int, say: Say) -> None:
    """Every tree's supervisor, started with nothing to do (`serve` with stdin at EOF: interpreter,
    imports, exit), which is what each host pays once per tfctl command (its `serve` conversation)."""
    h0 = bench.lab.hosts[0]
    env = {"HOME": h0.home, "PATH": os.environ["PATH"]}
    files = [(tree, *supervisor_file(bench, tree, bench.work / "supervisors")) for tree in trees]
    say(
        f"\n## Supervisor start-up per tree: `python -I -S <supervisor> serve` with nothing on stdin "
        f"(median of {reps * 3})\n"
    )
    say(
        "| tree | supervisor | size (KB) | controller (s) | host 0 over an open SSH connection (s) | host CPU (s) "
        "| host 0 `-X importtime`: top-level imports total (s) | largest top-level imports (ms) "
        "| largest own times, any depth (ms) |"
    )
    say("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    t = transport(bench, h0)
    try:
        for tree, form, path in files:
            argv = [PY, "-I", "-S", str(path), "serve"]
            ctl = wall(bench, argv, reps * 3)
            xs, times = [], reps * 3
            c0 = live_hosts_cpu([h0])
            for _ in range(times):
                t0 = time.perf_counter()
                r = t.run(shlex.join(argv), stdin=b"", timeout=60)
                xs.append(time.perf_counter() - t0)
                if not r.ok:
                    raise BenchError(f"{argv} on {h0.name}: exit {r.exit_code}: {r.stderr[-300:]}")
            cpu = (live_hosts_cpu([h0]) - c0) / times
            imp = h0.exec([PY, "-X", "importtime", *argv[1:]], input="", env=env, cwd=h0.home)
            if imp.returncode != 0:
                raise BenchError(f"-X importtime {path} on {h0.name}: exit {imp.returncode}: {imp.stderr[-300:]}")
            say(
                f"| {tree.name} | {form} | {path.stat().st_size / 1024:.0f} | {ctl:.3f} | {median(xs):.3f} | {cpu:.3f} "
                f"| {sum(us for us, _ in parse_importtime(imp.stderr)) / 1e6:.3f} | {top_imports(imp.stderr)} "
                f"| {own_times(imp.stderr)} |"
            )
    finally:
        t.close()


def parse_importtime(stderr: str) -> list[tuple[int, str]]:
    """(cumulative microseconds, module) of each top-level import in `-X importtime` output: the
    lines whose name follows "| " directly (each nesting level adds two more spaces)."""
    imports = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m.group(3)) == 1:
            imports.append((int(m.group(2)), m.group(4)))
    return imports


def top_imports(stderr: str, k: int = 6) -> str:
    return ", ".join(f"{name} {us / 1000:.0f}" for us, name in sorted(parse_importtime(stderr), reverse=True)[:k])


def own_times(stderr: str, k: int = 6) -> str:
    """The modules whose own import (compiling and running their body, without their imports)
    took longest, at any depth, in `-X importtime` output (ms)."""
    own = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \| *(\S+)", line)
        if m:
            own.append((int(m.group(1)), m.group(2)))
    return ", ".join(f"{name} {us / 1000:.0f}" for us, name in sorted(own, reverse=True)[:k])
