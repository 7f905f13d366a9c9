"""Tasks: start each under its own monitor (`monitor.py`), report their state, stop them and
their orphans.

Every task process carries TFCTL_RUN_ID and TFCTL_TASK in its environment, so stragglers that
left the task's process group (daemons, `setsid` children) are still found by `stop`/`reap`,
and TFCTL_RUN_DIR, the run's own directory on its host (`files.work_dir`).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Callable, Dict, List, NoReturn, Optional, Set

from . import containers, disk, guard, monitor, procfs
from .checks import port_owners
from .errors import AgentError
from .files import RUN_DIR_ENV, read_json, run_dir, state_root, task_dir, work_dir, write_json
from .logs import last_line, output_log, output_written, tail
from .marks import recent_marks
from .protocol import (
    PortInfo,
    ReapAnswer,
    ReapRequest,
    RestartAnswer,
    RestartRequest,
    StartAnswer,
    StartRequest,
    StatusAnswer,
    StatusRequest,
    StopAnswer,
    StopRequest,
    TailRequest,
    TaskInfo,
    TaskState,
)
from .state import task_state
from .usage import current_usage, read_cpu_total, read_usage, read_usage_points

START_PATIENCE = 15.0  # how long `start` waits for its monitors to record their tasks started
LISTEN_LOOK = 0.02  # seconds between looks at the ports while `status` waits for them to listen
EXIT_PATIENCE = 3.0  # how long `stop` waits for monitors to record the exits it caused
MONITOR_NAME = b"tfctl-monitor"  # a monitor's name in ps -e, top and pgrep (its cmdline is the supervisor's)


def start(root: str, request: StartRequest) -> StartAnswer:
    """Start each task under its own monitor; return once every task runs or has failed to."""
    run_id = request.run_id
    if request.lease > 0:
        guard.start_lease(root, run_id, request.lease)
    started: List[int] = []  # each monitor's pipe, which ends once it recorded its task's start
    work = work_dir(root, run_id)
    os.makedirs(work, mode=0o700, exist_ok=True)
    for launch in request.tasks:
        launch = launch.replace(env={**launch.env, RUN_DIR_ENV: work})
        d = task_dir(root, run_id, launch.task)
        if request.again and os.path.exists(os.path.join(d, "spec.json")):
            _set_aside(root, run_id, launch.task, request.again)
        if os.path.exists(os.path.join(d, "spec.json")):
            raise AgentError("task %s of run %s was already started on this host" % (launch.task, run_id))
        os.makedirs(d, mode=0o700, exist_ok=True)
        write_json(os.path.join(d, "spec.json"), launch.to_wire())
        if not request.spawn:
            continue
        started.append(spawn_monitor(d, run_id))
    if not request.spawn:
        return StartAnswer({launch.task: TaskInfo(launch.task) for launch in request.tasks})
    _wait_ended(started, START_PATIENCE)
    result = {}
    for launch in request.tasks:
        info = task_state(root, run_id, launch.task)
        if info.state is TaskState.PENDING:
            info = info.replace(state=TaskState.STARTING)
        result[launch.task] = info
    return StartAnswer(result)


def _set_aside(root: str, run_id: str, task: str, label: str) -> None:
    """What an earlier start of the task left on this host (its log, its exit), moved into
    `<label>/` of the run's state (`allocation1`: an allocation that ended under the run; `moved2`:
    a move to a spare), kept and pruned with the run, so the task starts afresh under its name."""
    d = task_dir(root, run_id, task)
    if procfs.task_processes(run_id, task, read_json(os.path.join(d, "proc.json"))):
        raise AgentError("task %s of run %s still runs on this host from its earlier start" % (task, run_id))
    aside = os.path.join(run_dir(root, run_id), label)
    os.makedirs(aside, mode=0o700, exist_ok=True)
    os.rename(d, os.path.join(aside, os.path.basename(d)))


def spawn_monitor(d: str, run_id: str) -> int:
    """Fork the task's monitor from this supervisor, whose code is loaded already: a new
    interpreter would put its start-up before every task's. Forked twice, so the monitor is not
    this process's child: it outlives it and leaves no zombie. Returns the read end of a pipe
    that ends once the monitor has recorded its task's start, or has failed or died."""
    mlog = os.open(os.path.join(d, "monitor.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    started, started_w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            _become_monitor(d, run_id, mlog, started_w)
        os.waitpid(pid, 0)
    finally:
        os.close(mlog)
        os.close(started_w)
    return started


def _become_monitor(d: str, run_id: str, mlog: int, started: int) -> NoReturn:
    """In the forked child: a session of its own, nothing of the supervisor's conversation held
    open (its stdin and stdout are the controller's channel), then the monitor, then exit without
    running anything of the supervisor's at exit."""
    code = 1
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # the supervisor's deferring handlers
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(mlog, 2)
        os.dup2(started, 3)
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))
        os.chdir("/")
        with open("/proc/self/comm", "wb") as comm:
            comm.write(MONITOR_NAME)
        monitor.monitor(d, run_id, started_fd=3)
        code = 0
    except BaseException:  # noqa: BLE001 - the monitor's last word, in its monitor.log
        import traceback  # here: ~2 ms that every supervisor start would pay for a rare failure

        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _wait_ended(pipes: List[int], patience: float) -> None:
    """Wait, asleep, until every pipe has ended or `patience` seconds have passed; close them."""
    deadline = time.monotonic() + patience
    waiting = set(pipes)
    try:
        while waiting and time.monotonic() < deadline:
            ready, _, _ = select.select(list(waiting), [], [], deadline - time.monotonic())
            waiting.difference_update(fd for fd in ready if not os.read(fd, 1))
    finally:
        for fd in pipes:
            os.close(fd)


def status(root: str, request: StatusRequest) -> StatusAnswer:
    """Each task's state, whether its own process listens on its port, its last line, what it
    uses (its monitor's last sample) and, when asked, its recent progress lines, last output
    lines and usage history. With `wait_listening`, the answer
    waits here (a look every 20 ms) until every task listens or has ended: a start waiting for
    its ps costs one round trip instead of a poll from the controller every few tenths."""
    deadline = time.monotonic() + request.wait_listening
    while True:
        answer = _status_now(root, request)
        settled = all(i.listening or i.state.is_final for i in answer.tasks.values())
        if settled or time.monotonic() >= deadline:
            return answer
        time.sleep(LISTEN_LOOK)


def _status_now(root: str, request: StatusRequest) -> StatusAnswer:
    run_id = request.run_id
    trouble = disk.trouble(state_root(root), root)
    if request.renew_lease:
        try:
            guard.renew_lease(root, run_id)
        except OSError as e:
            if not disk.refused(e):
                raise
            trouble = trouble or disk.why(e, root)
    listening = procfs.listening_sockets()
    out = {}
    now = time.time()
    for task, port in request.tasks.items():
        info = task_state(root, run_id, task)
        listens = False
        if info.state is TaskState.RUNNING and port in listening:
            proc = read_json(os.path.join(task_dir(root, run_id, task), "proc.json"))
            listens = _owns(listening[port], run_id, task, proc)
        uptime = None if info.started_at is None else (info.ended_at or now) - info.started_at
        log = output_log(root, run_id, task)
        written, lines = output_written(log, request.count_lines)
        info = info.replace(
            listening=listens,
            last_line=last_line(log),
            uptime=uptime,
            cpu_seconds=read_cpu_total(log),
            output_at=written,
            output_lines=lines,
        )
        if request.progress is not None:
            info = info.replace(marks=recent_marks(log, request.progress, now))
        if info.state is TaskState.RUNNING:
            info = info.replace(usage=current_usage(log, info.started_at))
            if request.usage_history:
                info = info.replace(usage_history=read_usage(log, request.usage_history, info.started_at or 0.0))
        if request.usage_points:
            info = info.replace(usage_history=read_usage_points(log, request.usage_points))
        out[task] = info
    tails = tail(root, TailRequest(run_id, list(request.tasks), request.tail)).tails if request.tail else {}
    return StatusAnswer(out, now, tails, disk=trouble or "")


def _owns(sockets: Set[int], run_id: str, task: str, proc: Optional[dict]) -> bool:
    """The task's own processes hold one of the listening sockets. Its process tree first (the
    usual owner, found in a few reads); else every process of the task, which means reading
    every process on the host: ~15 ms each time with a few hundred, on every status."""
    if proc is not None and procfs.is_same_process(proc):
        if procfs.socket_owners(sockets, procfs.descendants(proc["pid"])):
            return True
    return bool(procfs.socket_owners(sockets, procfs.task_processes(run_id, task, proc)))


def stop(root: str, request: StopRequest) -> StopAnswer:
    """Stop tasks (all of the run's on this host when none are named) and prove they are gone."""
    run_id = request.run_id
    tasks = request.tasks
    if tasks is None:
        base = run_dir(root, run_id)
        names = sorted(os.listdir(base)) if os.path.isdir(base) else []
        # Tasks only: not the state of earlier starts (`_set_aside`).
        tasks = [n.replace("-", ":", 1) for n in names if os.path.exists(os.path.join(base, n, "spec.json"))]
    procs: Dict[str, Optional[dict]] = {}
    # Tasks that had exited before this stop: their processes are not in its count. Recorded
    # as ended, or with no process left when it looks (its monitor writing how it ended).
    exited: Set[str] = set()
    alive: Set[str] = set()
    boxed: Set[str] = set()  # the names of the containers of the tasks that run in one
    for task in tasks:
        d = task_dir(root, run_id, task)
        if not os.path.isdir(d):
            continue
        procs[task] = read_json(os.path.join(d, "proc.json"))
        if (read_json(os.path.join(d, "spec.json")) or {}).get("container"):
            boxed.add(containers.name_for(run_id, task))
        if os.path.exists(os.path.join(d, "exit.json")):
            exited.add(task)
        elif not os.path.exists(os.path.join(d, "stop.json")):
            _ask_stop(d, procs[task])

    def find() -> List[int]:
        found: Set[int] = set()
        for task, proc in procs.items():
            pids = procfs.task_processes(run_id, task, proc)
            if pids:
                alive.add(task)
            found.update(pids)
        # Processes of this run whose task record is missing (a crashed start) are still ours.
        for pid in procfs.live_pids():
            if procfs.proc_env_markers(pid)[0] == run_id:
                found.add(pid)
        found.discard(os.getpid())
        return procfs.to_signal(sorted(found))

    def boxes() -> List[containers.Found]:
        return [f for f in containers.labelled(containers.RUN_LABEL, run_id) if f[1] in boxed] if boxed else []

    had = boxes()
    done = procfs.terminate(find, request.grace)
    # Their processes are gone, so are they, or nearly: what their runtime has not removed yet, it removes now.
    containers.remove(boxes())
    left = [name for _, name, _ in boxes()]
    port_state = ports_after_stop(request.ports, done.still_exiting)
    # Give monitors a moment to record the exit, so status right after `down` reads "stopped".
    deadline = time.monotonic() + EXIT_PATIENCE
    for task in procs:
        while not task_state(root, run_id, task).state.is_final and time.monotonic() < deadline:
            time.sleep(procfs.POLL)
    final: Dict[str, TaskInfo] = {t: task_state(root, run_id, t) for t in procs}
    ended = len(exited | (set(procs) - alive))
    return StopAnswer(done.processes, done.killed, done.remaining, port_state, final, len(had), left, ended)


def _ask_stop(d: str, proc: Optional[dict]) -> None:
    """stop.json; when the disk refuses it, the monitor is told instead (SIGUSR1) and records
    the stop itself once it can. The stop goes on either way: processes are found by marker."""
    try:
        write_json(os.path.join(d, "stop.json"), {"requested_at": time.time()})
    except OSError as e:
        if not disk.refused(e):
            raise
        monitor = (proc or {}).get("monitor")
        if monitor and procfs.is_same_process(monitor):
            os.kill(monitor["pid"], signal.SIGUSR1)


def restart(root: str, request: RestartRequest) -> RestartAnswer:
    """Ask the monitors of the running tasks among those named to restart them (`monitor.RESTART_FILE`)."""
    asked = []
    for task in request.tasks:
        if task_state(root, request.run_id, task).state is TaskState.RUNNING:
            d = task_dir(root, request.run_id, task)
            write_json(os.path.join(d, monitor.RESTART_FILE), {"requested_at": time.time(), "reason": request.reason})
            asked.append(task)
    return RestartAnswer(asked)


def ports_after_stop(
    wanted: List[int], exiting: Callable[[], bool], patience: float = 3.0, exit_patience: float = 15.0
) -> Dict[str, PortInfo]:
    """Port state once the processes are gone. A listening socket nobody owns is one the kernel
    is still tearing down: give it `patience`, and up to `exit_patience` while a stopped process
    is still `exiting` (its main thread gone, its other threads freeing a large heap, as
    TensorFlow's take seconds to on a loaded host, before its files close). Then call it busy."""
    began = time.monotonic()
    while True:
        state = port_owners(wanted)
        orphaned = [p for p, info in state.items() if info.listening and not info.pids]
        waited = time.monotonic() - began
        if not orphaned or waited > exit_patience or (waited > patience and not exiting()):
            return state
        time.sleep(procfs.POLL)


def reap(root: str, request: ReapRequest) -> ReapAnswer:
    """Stop every process started from this store (TFCTL_STORE) whose run is not live: orphans
    of a crashed controller. Runs started by other stores (other users, other homes) are never
    touched, even when this store has never heard of them."""
    live = set(request.live_runs)

    def orphan(markers: Dict[str, str]) -> bool:
        run = markers.get(procfs.RUN_ENV)
        return markers.get(procfs.STORE_ENV) == request.store and run is not None and run not in live

    def find() -> List[int]:
        me = os.getpid()
        return procfs.to_signal([p for p in procfs.live_pids() if p != me and orphan(procfs.proc_markers(p))])

    # Containers of such runs, found by label: those whose processes are stopped here, and any a
    # crashed tfctl left stopped but not removed.
    boxes = [f for f in containers.labelled(containers.STORE_LABEL, request.store) if f[2] not in live]
    if request.containers_only:
        containers.remove(boxes)
        return ReapAnswer(0, 0, [], sorted({run for _, _, run in boxes}), len(boxes))
    runs = {run for run in (procfs.proc_env_markers(p)[0] for p in find()) if run is not None}
    done = procfs.terminate(find, request.grace)
    containers.remove(boxes)
    runs.update(run for _, _, run in boxes)
    return ReapAnswer(done.processes, done.killed, done.remaining, sorted(runs), len(boxes))
