"""TensorBoard for a run (`tfctl tensorboard`): started on the chief's host over the run's
`logdir`, reached through a forwarded local port, and stopped, verified gone, at the end.

TensorBoard listens on the host's loopback only, on a port it picks itself (`--port 0`, read
back from the URL it prints), so nothing is exposed and no port is raced for. Its processes
carry a marker of their own (TFCTL_RUN_ID=<run>.tensorboard.<hex>) and are stopped by the host's
supervisor as a run's are, by PID: SIGTERM, grace, SIGKILL, then a fresh scan and a port check.
The marker is not the run's, so `tfctl down` of the run leaves them alone; `tfctl down --all`
counts them as leftovers should tfctl itself be killed.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import re
import secrets
import shlex
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from tfctl.cluster.agent import HostAgent, open_agent
from tfctl.cluster.reach import in_context
from tfctl.errors import HostError, TfctlError, UsageError
from tfctl.runs.record import RunRecord, TaskSpec
from tfctl.runs.store import RunStore
from tfctl.supervisor.procfs import RUN_ENV, STORE_ENV
from tfctl.supervisor.protocol import StopRequest
from tfctl.transport.base import Stream, shell_path
from tfctl.transport.forward import Forwarder, listen

START_TIMEOUT = 120.0  # TensorBoard imports TensorFlow when it finds it: seconds on a busy host
STOP_GRACE = 5.0
RUN_POLL = 2.0  # how often a live run is checked for its end
_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/")
_PID = re.compile(r"^tfctl-pid (\d+)$")
_NO_MODULE = re.compile(r"No module named '?tensorboard")
EVENTS = "events.out.tfevents.*"  # the files tf.summary writes


def board_task(record: RunRecord) -> TaskSpec:
    """The chief, or worker 0 when there is none: where TF's summaries are written."""
    names = [t.name for t in record.tasks]
    for name in ("chief:0", "worker:0"):
        if name in names:
            return record.task(name)
    return record.tasks[0]


@dataclass(frozen=True)
class Started:
    host: str
    task: str
    pid: int
    remote_port: int
    local_port: int
    local_port_taken: bool  # the port asked for was busy, so `local_port` is another one
    logdir: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}/"


@dataclass(frozen=True)
class Stopped:
    """How TensorBoard ended and what stopping it proved."""

    why: str
    host: str
    processes: int
    remaining: tuple[int, ...]
    port_holder: str | None  # who still listens on TensorBoard's port once it is stopped; None: nobody

    @property
    def clean(self) -> bool:
        return not self.remaining and self.port_holder is None


class _Output:
    """TensorBoard's output lines as they come, and the last few for an error message."""

    def __init__(self, stream: Stream) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.tail: collections.deque[str] = collections.deque(maxlen=15)
        self.ended = threading.Event()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Stream) -> None:
        try:
            for line in stream.lines():
                self.tail.append(line)
                self.lines.put(line)
        except (OSError, EOFError):
            pass
        finally:
            self.ended.set()
            self.lines.put(None)

    def text(self) -> str:
        return "\n".join(f"  {line}" for line in self.tail if line.strip())


def serve(
    store: RunStore,
    record: RunRecord,
    local_port: int,
    on_started: Callable[[Started], None],
    say: Callable[[str], None],
) -> Stopped:
    """Run TensorBoard for `record` until Ctrl-C (or SIGTERM, SIGHUP), the run's end (if it is
    live now), or TensorBoard's own end; then stop it and return what stopping it proved."""
    if record.logdir is None:
        raise UsageError(
            f"run {record.run_id} has no logdir: its cluster file {record.cluster_file} had no `logdir` key",
            hint="add e.g. `logdir: logs/{run_id}` (relative paths start at each task's workdir), write "
            "TensorBoard summaries there (the `{logdir}` placeholder gives your command the path), "
            "and start a new run",
        )
    task = board_task(record)
    spec = next(h for h in record.hosts if h.name == task.host)
    agent = open_agent(spec)
    try:
        _check_summaries(agent, record, task, record.logdir, say)
    except BaseException:
        agent.close()
        raise
    marker = f"{record.run_id}.tensorboard.{secrets.token_hex(3)}"
    env = {k: v for k, v in task.env.items() if k != "TF_CONFIG"}  # not a member of the TF cluster
    env[RUN_ENV] = marker
    if record.store:
        env[STORE_ENV] = record.store
    board = (
        f"echo tfctl-pid $$ && exec {shell_path(agent.python)} -m tensorboard.main "
        f"--logdir {shell_path(record.logdir)} --host 127.0.0.1 --port 0"
    )
    forwarder = stream = remote_port = None
    try:
        with _signals_as_interrupt():
            try:
                stream = agent.transport.stream(f"exec 2>&1 && {in_context(task.cwd, env, board)}")
                output = _Output(stream)
                pid, remote_port = _wait_until_serving(output, task.host, agent.python)
                sock, taken = listen(local_port)
                forwarder = Forwarder(sock, lambda: agent.transport.tunnel(remote_port), say)
                on_started(Started(task.host, task.name, pid, remote_port, forwarder.port, taken, record.logdir))
                why = _wait_for_end(store, record, output)
            except KeyboardInterrupt as e:
                why = str(e) if isinstance(e, _Signalled) else "Ctrl-C"
            except BaseException:
                if stream is not None:  # whatever went wrong, leave nothing running there
                    with contextlib.suppress(TfctlError):
                        _stop(agent, marker, remote_port, "error")
                raise
        if forwarder is not None:
            forwarder.close()
            forwarder = None
        return _stop(agent, marker, remote_port, why)
    finally:
        if forwarder is not None:
            forwarder.close()
        if stream is not None:
            stream.close()
        agent.close()


def _check_summaries(
    agent: HostAgent, record: RunRecord, task: TaskSpec, logdir: str, say: Callable[[str], None]
) -> None:
    """Say plainly when the logdir holds no event file (TensorBoard would show an empty page
    without a word): a run that has ended never will, so that is an error; a live one may yet."""
    where = shell_path(logdir)
    found_one = f"find {where} -name {shlex.quote(EVENTS)} -type f | head -n 1 | wc -l"
    look = f"if [ -d {where} ]; then {found_one}; else echo missing; fi"
    found = agent.transport.run(in_context(task.cwd, {}, look), timeout=60).stdout.strip()
    if found not in ("0", "missing"):
        return
    path = logdir if logdir.startswith(("/", "~")) or not task.cwd else f"{task.cwd.rstrip('/')}/{logdir}"
    what = "does not exist" if found == "missing" else f"holds no TensorBoard event file ({EVENTS})"
    why = (
        f"the logdir {task.host}:{path} (the run's `logdir`, from {task.name}'s workdir) {what}: "
        "its program wrote no summaries there"
    )
    fix = (
        "write them with tf.summary (a tf.summary.create_file_writer, or TF1's FileWriter) to the path "
        "`{logdir}` gives the command, as the templates of `tfctl init` do with --logdir={logdir}"
    )
    if not record.active:
        raise UsageError(f"run {record.run_id} has nothing for TensorBoard: {why}", hint=fix)
    say(f"{why} yet; TensorBoard shows them once it does ({fix})")


def _wait_until_serving(output: _Output, host: str, python: str) -> tuple[int, int]:
    """(pid, port) of TensorBoard once it serves; HostError with its last words if it never does."""
    pid = None
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            line = output.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise HostError(
                host, f"TensorBoard did not serve within {START_TIMEOUT:g}s; its output:\n{output.text()}"
            ) from None
        if line is None:
            if any(_NO_MODULE.search(text) for text in output.tail):
                raise HostError(
                    host,
                    f"{python} has no tensorboard",
                    hint=f"install it there: {python} -m pip install tensorboard "
                    f"(or point `python` in the cluster file at one that has it)",
                )
            raise HostError(host, f"TensorBoard ended before serving; its output:\n{output.text()}")
        found = _PID.match(line)
        if found:
            pid = int(found.group(1))
        url = _URL.search(line)
        if url and pid is not None:
            return pid, int(url.group(1))


def _wait_for_end(store: RunStore, record: RunRecord, output: _Output) -> str:
    """Why serving ended: the run ended (only a run live at the start can), or TensorBoard did."""
    watch_run = record.active
    while not output.ended.wait(RUN_POLL):
        if watch_run and not store.load(record.run_id).active:
            return f"run {record.run_id} ended"
    return f"TensorBoard ended by itself:\n{output.text()}"


def _stop(agent: HostAgent, marker: str, port: int | None, why: str) -> Stopped:
    """Every process carrying `marker` on the host: SIGTERM, grace, SIGKILL, checked gone, by PID."""
    answer = agent.call(StopRequest(marker, STOP_GRACE, [port] if port else []), timeout=STOP_GRACE + 60)
    holders = [
        f"pid {info.pids[0]}: {info.command[:80]}" if info.pids else "a process this user cannot see"
        for info in answer.ports.values()
        if info.listening
    ]
    return Stopped(why, agent.host, answer.processes, tuple(answer.remaining), holders[0] if holders else None)


class _Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP, taken as Ctrl-C is; its text is the signal's name."""


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (terminal closed) end serving as Ctrl-C does, so TensorBoard is stopped."""

    def interrupt(number: int, _frame: object) -> None:
        raise _Signalled(signal.Signals(number).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)
