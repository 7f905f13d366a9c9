"""The monitor: one small process per task that runs it, restarts it if its job says so, and
records how it ended.

It lives in its own session, detached from the controller, so a task survives the controller
or its SSH channel going away. It records pid, process group and the kernel start time (so a
reused pid is never taken for the task) and pins the task to the cores it was placed on, if
any; while the task runs it applies the host's own rules (`guard`: the lease, the idle rule);
when the task ends it either starts it again (`restart` policy, after `backoff` seconds) or
records the exit in exit.json and kills whatever the task left behind in its group. Files:
proc.json (the current process), restarts.json (how and when earlier runs ended, and whether a
restart is pending), exit.json (the end), stop.json (who stopped it), output.usage (what its
process tree used, every few seconds: `usage`). A disk that refuses these writes does not end
the monitor: it holds the record and writes it once it can (`disk`).
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import time
from typing import Any, BinaryIO, Dict, List, Optional, Tuple

from . import claims, containers, devices, disk, guard, procfs
from .errors import AgentError
from .files import read_json, write_json
from .protocol import RestartRule, TaskLaunch
from .timeline import TimeNotes
from .usage import UsageNotes, visible_gpus

GUARD_POLL = 1.0  # how often a monitor checks its task's lease and idle rule
BACKOFF_POLL = 0.1  # how often a pending restart checks whether the task was stopped meanwhile
_STOPS: List[Dict[str, Any]] = []  # stop.json records the disk refused, held until it takes them
RESTART_FILE = "restart.json"  # a restart asked for by the controller (`tasks.restart`), and why
SHELL_WORDS = {"if", "for", "while", "until", "case", "{", "!", "cd", "export", "set", "exec", "time", "."}


def monitor(d: str, run_id: str, started_fd: Optional[int] = None) -> None:
    """Run one task to its end (through its restarts), record how it ended, clean up after it.
    `started_fd` is closed once the first start is recorded: the supervisor's `start` waits for
    that (or for this process's end, which closes it too)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # `stop` signals this when the disk refused its stop.json: the end is then recorded as a stop.
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: _STOPS.append({"requested_at": time.time()}))
    launch = TaskLaunch.from_wire(read_json(os.path.join(d, "spec.json")) or {})
    log = open(os.path.join(d, "output.log"), "ab", buffering=0)
    held: Optional[claims.Claims] = None
    if launch.claims is not None:
        try:
            held = claims.take(launch.claims, run_id, launch.task)
        except (AgentError, OSError) as e:
            _record_failed_start(d, log, "could not claim its share of this host: %s" % e)
            return
    try:
        _run(d, run_id, launch, log, started_fd, held)
    finally:
        if held is not None:
            held.release()


def _run(
    d: str, run_id: str, launch: TaskLaunch, log: BinaryIO, started_fd: Optional[int], held: Optional[claims.Claims]
) -> None:
    """The task's life, holding its claims (if any): every start of it is handed them too."""
    markers = {procfs.RUN_ENV: run_id, procfs.TASK_ENV: launch.task}
    if launch.store:
        markers[procfs.STORE_ENV] = launch.store
    env = dict(os.environ)
    env.update(launch.env)
    if launch.path_first:
        env["PATH"] = launch.path_first + os.pathsep + env.get("PATH", os.defpath)
    env.update(markers)
    log_path = os.path.join(d, "output.log")
    boxed: Optional[containers.Tethered] = None
    argv = ["/bin/sh", "-c", exec_form(launch.command)]
    if launch.container is not None:
        # The runtime's client runs with this host's environment; the task's is the container's.
        try:
            boxed = containers.Tethered(d, run_id, launch, {**launch.env, **markers}, exec_form(launch.command))
        except (AgentError, OSError) as e:
            _record_failed_start(d, log, "could not run in a container: %s" % e)
            return
        argv, env = boxed.argv, dict(os.environ)
    cores = launch.cpus
    if cores is not None or held is not None and launch.claims is not None and launch.claims.cpus:
        # Pinned here, before the first start, so every run of the task inherits the cores.
        try:
            if cores is None and held is not None:
                cores = held.cores(devices.cpu_cores())  # the cores it claimed, as the host numbers them
            devices.pin(cores or [])
        except (OSError, ValueError) as e:
            _record_failed_start(
                d, log, "could not run on cores %s: %s" % (cores if cores is not None else "it claimed", e)
            )
            return
    notes = TimeNotes(log_path)
    outage = disk.Outage(d, log_path)
    meter = UsageNotes(log_path, visible_gpus(launch.env))
    ends: List[str] = []
    spans: List[List[float]] = []  # [started_at, ended_at] of each run that was restarted: `report`'s timeline
    while True:
        _discard(os.path.join(d, RESTART_FILE))  # asked of an earlier run of the task: not of this one
        if boxed is not None:
            boxed.forget_exit()
        try:
            child = subprocess.Popen(
                argv,
                cwd=os.path.expanduser(launch.cwd or "~"),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                pass_fds=held.fds if held is not None else (),  # the task holds its claims too
            )
        except OSError as e:
            _record_failed_start(d, log, "could not start: %s" % e)
            return
        proc = _record_process(d, child)
        if started_fd is not None:
            os.close(started_fd)
            started_fd = None
        meter.begin(child.pid, proc["started_at"])
        if boxed is not None:
            boxed.root = None  # the container of this run of the task, once it is there
        code, asked = _wait_guarded(child, d, run_id, launch, proc, notes, outage, meter, boxed)
        if boxed is not None:
            code = boxed.exit_code(code, launch.grace + 5.0)
        # Whatever this run of the task started must not outlive it, restarted or not; what a stop
        # has signalled already is given its grace, not a second SIGTERM (a save run twice).
        stopped = bool(_STOPS) or os.path.exists(os.path.join(d, "stop.json"))
        _clean_up(run_id, launch, proc, boxed, signalled=stopped)
        if asked is not None:
            wanted = launch.restart is not None and len(ends) < launch.restart.max_restarts
            if not wanted or os.path.exists(os.path.join(d, "stop.json")):
                break
        elif not _restart_wanted(launch.restart, code, len(ends), d):
            break
        ends.append(asked or _end_text(code))
        spans.append([proc["started_at"], time.time()])
        assert launch.restart is not None
        _say(
            log,
            "tfctl: %s %s; restart %d of %d in %gs\n"
            % (launch.task, ends[-1], len(ends), launch.restart.max_restarts, launch.restart.backoff),
        )
        notes.note()
        _write_restarts(d, ends, spans, pending=True)
        if not _back_off(d, launch.restart.backoff):
            break
        _write_restarts(d, ends, spans, pending=False)
    notes.note()
    _record_end(d, code, ends, spans, outage)


def _record_end(d: str, code: int, ends: List[str], spans: List[List[float]], outage: disk.Outage) -> None:
    """exit.json (and stop.json first, when a stop could not write it); while the disk refuses
    them, this process holds the end in its name for `status` to read."""
    ended = {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None, "ended_at": time.time()}
    stop_path = os.path.join(d, "stop.json")

    def holding() -> None:
        disk.hold_end(code, stopped=bool(_STOPS) or os.path.exists(stop_path))
        outage.check()

    if _STOPS and not os.path.exists(stop_path):
        stop = dict(_STOPS[0], requested_at=min(_STOPS[0]["requested_at"], ended["ended_at"]))
        disk.keep(stop_path, stop, holding)
    if ends:
        disk.keep(os.path.join(d, "restarts.json"), {"ends": ends, "spans": spans, "pending": False}, holding)
    disk.keep(os.path.join(d, "exit.json"), ended, holding)
    outage.check()


def _say(log: BinaryIO, text: str) -> None:
    """A line of tfctl's in the task's log, unless the disk refuses it."""
    try:
        log.write(text.encode())
    except OSError:
        pass


def _record_failed_start(d: str, log: BinaryIO, error: str) -> None:
    ended = {"exit_code": 127, "signal": None, "ended_at": time.time(), "error": error}
    disk.keep(os.path.join(d, "exit.json"), ended, lambda: disk.hold_end(127, stopped=False))
    _say(log, "tfctl: task %s\n" % error)


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


def _clean_up(
    run_id: str, launch: TaskLaunch, proc: Dict[str, Any], boxed: Optional[containers.Tethered], signalled: bool
) -> None:
    find = lambda: procfs.to_signal(procfs.task_processes(run_id, launch.task, proc))  # noqa: E731
    procfs.terminate(find, launch.grace, signalled=signalled)
    if boxed is not None:
        boxed.remove()


def _end_task(run_id: str, launch: TaskLaunch, proc: Dict[str, Any], boxed: Optional[containers.Tethered]) -> None:
    """Stop a running task: its container by its runtime (SIGTERM, `grace`, SIGKILL), then
    whatever of the task is left, by signal."""
    if boxed is not None:
        boxed.stop()
    procfs.terminate(lambda: procfs.to_signal(procfs.task_processes(run_id, launch.task, proc)), launch.grace)


def _record_process(d: str, child: subprocess.Popen) -> Dict[str, Any]:
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
    disk.keep(os.path.join(d, "proc.json"), proc)
    return proc


def _restart_wanted(rule: Optional[RestartRule], code: int, restarts: int, d: str) -> bool:
    """Kubeflow TFJob's policies: `on-failure` restarts any failure; `exit-code` only a death by
    signal or an exit code of 128 or more (1-127 are the program's own verdict: permanent)."""
    if rule is None or code == 0 or restarts >= rule.max_restarts:
        return False
    if _STOPS or os.path.exists(os.path.join(d, "stop.json")):
        return False  # stopped by tfctl down or by its host's rules: not a failure
    if rule.policy == "on-failure":
        return True
    return rule.policy == "exit-code" and (code < 0 or code >= 128)


def _end_text(code: int) -> str:
    return "was killed by signal %d" % -code if code < 0 else "exited with code %d" % code


def _discard(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _write_restarts(d: str, ends: List[str], spans: List[List[float]], pending: bool) -> None:
    disk.keep(os.path.join(d, "restarts.json"), {"ends": ends, "spans": spans, "pending": pending})


def _back_off(d: str, seconds: float) -> bool:
    """Wait before a restart; False if the task was stopped meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _STOPS or os.path.exists(os.path.join(d, "stop.json")) or guard.lease_expired(d):
            return False
        time.sleep(BACKOFF_POLL)
    return not _STOPS and not os.path.exists(os.path.join(d, "stop.json"))


def _wait_guarded(
    child: subprocess.Popen,
    d: str,
    run_id: str,
    launch: TaskLaunch,
    proc: dict,
    notes: TimeNotes,
    outage: disk.Outage,
    meter: UsageNotes,
    boxed: Optional[containers.Tethered],
) -> Tuple[int, Optional[str]]:
    """Wait for the task to end, noting once a second how far its output got (`timeline`) and
    every few seconds what it uses (`usage`); stop
    it first if its run's lease runs out or the job it serves is over (`guard`), recording why,
    so `status` can tell. Also stops it when the controller asks for a restart: the exit code,
    and why a restart was asked (None: it was not)."""
    idle = guard.IdleWatch(launch.idle, time.monotonic()) if launch.idle else None
    with _ExitWatch(child) as ended:
        while True:
            code = ended(GUARD_POLL)
            if code is not None:
                outage.check()
                return code, None
            notes.note()
            outage.check()
            if boxed is not None and boxed.root is None:
                _measure_container(boxed, run_id, launch.task, proc, meter)
            meter.note()
            asked = read_json(os.path.join(d, RESTART_FILE))
            if asked is not None:
                _discard(os.path.join(d, RESTART_FILE))
                _end_task(run_id, launch, proc, boxed)
                return child.wait(), str(asked.get("reason") or "restart asked by tfctl")
            why = guard.lease_expired(d) or (idle.check(time.monotonic()) if idle else None)
            if why is None:
                continue
            if not os.path.exists(os.path.join(d, "stop.json")):
                _note_stop(d, {"requested_at": time.time(), "reason": why})
            _end_task(run_id, launch, proc, boxed)
            return child.wait(), None


def _measure_container(boxed: containers.Tethered, run_id: str, task: str, proc: dict, meter: UsageNotes) -> None:
    """What the task uses is what its container's processes use, not the runtime's client: once
    the container's first process (the tether) is there, the usage notes follow its tree."""
    marked = set(procfs.task_processes(run_id, task, None))
    roots = [pid for pid in marked if (procfs.proc_stat(pid) or {}).get("ppid") not in marked]
    if len(roots) == 1:
        boxed.root = roots[0]
        meter.begin(roots[0], proc["started_at"])


def _note_stop(d: str, stop: Dict[str, Any]) -> None:
    """stop.json, or held for `_record_end` when the disk refuses it: the task stops either way."""
    try:
        write_json(os.path.join(d, "stop.json"), stop)
    except OSError as e:
        if not disk.refused(e):
            raise
        _STOPS.append(stop)


class _ExitWatch:
    """Wait up to a timeout for a child to end, asleep: on a pidfd where there is one (Linux 5.3,
    Python 3.9), as Popen.wait with a timeout wakes every 50 ms to poll, a task's whole life."""

    def __init__(self, child: subprocess.Popen) -> None:
        self.child = child
        self.fd: Optional[int] = None
        try:
            self.fd = os.pidfd_open(child.pid)
        except (AttributeError, OSError):
            pass

    def __enter__(self) -> "_ExitWatch":
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def __call__(self, timeout: float) -> Optional[int]:
        """The exit code, or None if the child still runs after `timeout` seconds."""
        if self.fd is None:
            try:
                return self.child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
        select.select([self.fd], [], [], timeout)
        return self.child.poll()
