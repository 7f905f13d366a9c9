"""Tasks: start each under its own monitor, report their state, stop them and their orphans.

Each task runs under a small monitor process (`_monitor`), in its own session and process group,
detached from the controller, so it survives the controller or its SSH channel going away. The
monitor records pid, process group and the kernel start time (so a reused pid is never taken for
the task) and, when the task ends on its own, its exit code; then it kills whatever the task left
behind in its group. Every task process carries TFCTL_RUN_ID and TFCTL_TASK in its environment, so
stragglers that left the group (daemons, `setsid` children) are still found by `stop`/`sweep`.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Set

from . import guard, procfs
from .checks import port_owners
from .errors import AgentError
from .files import read_json, run_dir, task_dir, write_json
from .logs import last_line, output_log
from .protocol import (
    PortInfo,
    StartAnswer,
    StartRequest,
    StatusAnswer,
    StatusRequest,
    StopAnswer,
    StopRequest,
    SweepAnswer,
    SweepRequest,
    TaskInfo,
    TaskLaunch,
    TaskState,
)
from .state import task_state

START_PATIENCE = 15.0  # how long `start` waits for each monitor to report the task running
EXIT_PATIENCE = 3.0  # how long `stop` waits for monitors to record the exits it caused
GUARD_POLL = 1.0  # how often a monitor checks its task's lease and idle rule
HERE = os.path.dirname(os.path.abspath(__file__))  # at import, before anything could change the cwd
SHELL_WORDS = {"if", "for", "while", "until", "case", "{", "!", "cd", "export", "set", "exec", "time", "."}


def exec_form(command: str) -> str:
    """`exec COMMAND` when COMMAND is one simple command, so the task's pid is the program's own
    (dash does not exec the last command) and its exit signal is reported as a signal."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return command
    if not tokens or "\n" in command or any(set(t) <= set(";&|()") for t in tokens):
        return command
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]) or tokens[0] in SHELL_WORDS:
        return command
    return "exec " + command


def supervisor_artifact() -> str:
    """The zipapp this code was loaded from, or its unpacked copy (the parent of this package in
    either), so a monitor runs the very same supervisor."""
    archive = os.path.dirname(HERE)
    if not os.path.isfile(archive) and not os.path.isfile(os.path.join(archive, "__main__.py")):
        raise AgentError("tasks can be started only by the supervisor's zipapp, not from %s" % HERE)
    return archive


def start(root: str, request: StartRequest) -> StartAnswer:
    """Start each task under its own monitor; return once every task runs or has failed to."""
    run_id = request.run_id
    artifact = supervisor_artifact()
    if request.lease > 0:
        guard.start_lease(root, run_id, request.lease)
    started: Dict[str, str] = {}
    for launch in request.tasks:
        d = task_dir(root, run_id, launch.task)
        if os.path.exists(os.path.join(d, "spec.json")):
            raise AgentError("task %s of run %s was already started on this host" % (launch.task, run_id))
        os.makedirs(d, mode=0o700, exist_ok=True)
        write_json(os.path.join(d, "spec.json"), launch.to_wire())
        with open(os.path.join(d, "monitor.log"), "ab") as mlog:
            subprocess.Popen(
                [sys.executable, "-I", "-S", artifact, "_monitor", d, run_id],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=mlog,
                start_new_session=True,
                close_fds=True,
                cwd="/",
            )
        started[launch.task] = d
    deadline = time.monotonic() + START_PATIENCE
    result = {}
    for task, d in started.items():
        while time.monotonic() < deadline:
            if os.path.exists(os.path.join(d, "proc.json")) or os.path.exists(os.path.join(d, "exit.json")):
                break
            time.sleep(procfs.POLL)
        info = task_state(root, run_id, task)
        if info.state is TaskState.PENDING:
            info = info.replace(state=TaskState.STARTING)
        result[task] = info
    return StartAnswer(result)


def monitor(d: str, run_id: str) -> None:
    """Run one task to its end, record how it ended, and clean up what it left behind."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    launch = TaskLaunch.from_wire(read_json(os.path.join(d, "spec.json")) or {})
    env = dict(os.environ)
    env.update(launch.env)
    env[procfs.RUN_ENV] = run_id
    env[procfs.TASK_ENV] = launch.task
    if launch.store:
        env[procfs.STORE_ENV] = launch.store
    log = open(os.path.join(d, "output.log"), "ab", buffering=0)
    try:
        child = subprocess.Popen(
            ["/bin/sh", "-c", exec_form(launch.command)],
            cwd=os.path.expanduser(launch.cwd or "~"),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        write_json(
            os.path.join(d, "exit.json"),
            {"exit_code": 127, "signal": None, "ended_at": time.time(), "error": "could not start: %s" % e},
        )
        log.write(("tfctl: could not start task: %s\n" % e).encode())
        return
    me = procfs.proc_stat(os.getpid()) or {}
    child_stat = procfs.proc_stat(child.pid) or {}
    boot = procfs.boot_id()
    proc = {
        "pid": child.pid,
        "pgid": child.pid,
        "starttime": child_stat.get("starttime"),
        "boot_id": boot,
        "started_at": time.time(),
        "monitor": {"pid": os.getpid(), "starttime": me.get("starttime"), "boot_id": boot},
    }
    write_json(os.path.join(d, "proc.json"), proc)
    code = _wait_guarded(child, d, run_id, launch, proc)
    ended = {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None, "ended_at": time.time()}
    write_json(os.path.join(d, "exit.json"), ended)
    # The task is over; anything it started must not outlive it.
    procfs.terminate(lambda: procfs.task_processes(run_id, launch.task, proc), launch.grace)


def _wait_guarded(child: subprocess.Popen, d: str, run_id: str, launch: TaskLaunch, proc: dict) -> int:
    """Wait for the task to end; stop it first if its run's lease runs out or the job it
    serves is over (`guard`), recording why, so `status` can tell."""
    idle = guard.IdleWatch(launch.idle, time.monotonic()) if launch.idle else None
    while True:
        try:
            return child.wait(timeout=GUARD_POLL)
        except subprocess.TimeoutExpired:
            pass
        why = guard.lease_expired(d) or (idle.check(time.monotonic()) if idle else None)
        if why is None:
            continue
        if not os.path.exists(os.path.join(d, "stop.json")):
            write_json(os.path.join(d, "stop.json"), {"requested_at": time.time(), "reason": why})
        procfs.terminate(lambda: procfs.task_processes(run_id, launch.task, proc), launch.grace)
        return child.wait()


def status(root: str, request: StatusRequest) -> StatusAnswer:
    """Each task's state, whether its own process listens on its port, and its last line."""
    run_id = request.run_id
    if request.renew_lease:
        guard.renew_lease(root, run_id)
    listening = procfs.listening_sockets()
    out = {}
    now = time.time()
    for task, port in request.tasks.items():
        info = task_state(root, run_id, task)
        listens = False
        if info.state is TaskState.RUNNING and port in listening:
            proc = read_json(os.path.join(task_dir(root, run_id, task), "proc.json"))
            listens = bool(procfs.socket_owners(listening[port], procfs.task_processes(run_id, task, proc)))
        uptime = None if info.started_at is None else (info.ended_at or now) - info.started_at
        out[task] = info.replace(listening=listens, last_line=last_line(output_log(root, run_id, task)), uptime=uptime)
    return StatusAnswer(out, now)


def stop(root: str, request: StopRequest) -> StopAnswer:
    """Stop tasks (all of the run's on this host when none are named) and prove they are gone."""
    run_id = request.run_id
    tasks = request.tasks
    if tasks is None:
        base = run_dir(root, run_id)
        tasks = [n.replace("-", ":", 1) for n in sorted(os.listdir(base))] if os.path.isdir(base) else []
    procs: Dict[str, Optional[dict]] = {}
    for task in tasks:
        d = task_dir(root, run_id, task)
        if not os.path.isdir(d):
            continue
        if not os.path.exists(os.path.join(d, "exit.json")) and not os.path.exists(os.path.join(d, "stop.json")):
            write_json(os.path.join(d, "stop.json"), {"requested_at": time.time()})
        procs[task] = read_json(os.path.join(d, "proc.json"))

    def find() -> List[int]:
        found: Set[int] = set()
        for task, proc in procs.items():
            found.update(procfs.task_processes(run_id, task, proc))
        # Processes of this run whose task record is missing (a crashed start) are still ours.
        for pid in procfs.live_pids():
            if procfs.proc_env_markers(pid)[0] == run_id:
                found.add(pid)
        found.discard(os.getpid())
        return sorted(found)

    done = procfs.terminate(find, request.grace)
    port_state = ports_after_stop(request.ports)
    # Give monitors a moment to record the exit, so status right after `down` reads "stopped".
    deadline = time.monotonic() + EXIT_PATIENCE
    for task in procs:
        path = os.path.join(task_dir(root, run_id, task), "exit.json")
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(procfs.POLL)
    final: Dict[str, TaskInfo] = {t: task_state(root, run_id, t) for t in procs}
    return StopAnswer(done.processes, done.killed, done.remaining, port_state, final)


def ports_after_stop(wanted: List[int], patience: float = 3.0) -> Dict[str, PortInfo]:
    """Port state once the processes are gone. A listening socket nobody owns any more is one
    the kernel is still tearing down: give it a moment before calling the port busy."""
    deadline = time.monotonic() + patience
    while True:
        state = port_owners(wanted)
        orphaned = [p for p, info in state.items() if info.listening and not info.pids]
        if not orphaned or time.monotonic() > deadline:
            return state
        time.sleep(procfs.POLL)


def sweep(root: str, request: SweepRequest) -> SweepAnswer:
    """Stop every process started from this store (TFCTL_STORE) whose run is not live: orphans
    of a crashed controller. Runs started by other stores (other users, other homes) are never
    touched, even when this store has never heard of them."""
    live = set(request.live_runs)

    def orphan(markers: Dict[str, str]) -> bool:
        run = markers.get(procfs.RUN_ENV)
        return markers.get(procfs.STORE_ENV) == request.store and run is not None and run not in live

    def find() -> List[int]:
        me = os.getpid()
        return [p for p in procfs.live_pids() if p != me and orphan(procfs.proc_markers(p))]

    runs = sorted({run for run in (procfs.proc_env_markers(p)[0] for p in find()) if run is not None})
    done = procfs.terminate(find, request.grace)
    return SweepAnswer(done.processes, done.killed, done.remaining, runs)
