"""A fake host agent: the controller's test seam, like Fabric's MockRemote.

`FakeHost` answers the typed protocol as a host supervisor would, for tasks whose lives are
scripted (`TaskScript`): when they listen, when they end and how, what they print, whether their
restart policy starts them again. No process, no socket, no sleep: the controller's decisions
(phase order, cleanup, patience, success policies) are tested in milliseconds. Every request is
recorded in a `Journal` shared by the hosts of one test, so tests can assert the order of what the
controller did across hosts.
"""

from __future__ import annotations

import base64
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from tfctl.errors import HostError
from tfctl.runs.record import HostSpec, RunRecord, TaskSpec
from tfctl.supervisor import protocol as p
from tfctl.supervisor import stream as follow_stream
from tfctl.transport.base import Stream
from tfctl.transport.specs import SSHSpec


@dataclass
class TaskScript:
    """One task's scripted life, counted in status requests its host answered after the start."""

    listen_after: int | None = 0  # None: never listens
    end_after: int | None = None  # None: runs until stopped; 0: over by the time its start is answered
    exit_code: int = 0
    signal: int | None = None
    exits_at_start: bool = False
    lines: list[str] = field(default_factory=list)  # its whole output, there from its start
    after_restart: TaskScript | None = None  # its life once its restart policy started it again (None: the same)
    usage: list[p.Usage] = field(default_factory=list)  # its monitor's usage samples while it runs, oldest first
    quiet_for: float = 0.0  # its progress lines were all printed this long before each look: it stalls
    cpu_seconds: float | None = None  # CPU time its monitor counted over every run of it


def end_text(exit_code: int | None, signal: int | None) -> str:
    """How one run of a restarted task ended, as its monitor writes it (`monitor._end_text`)."""
    return f"was killed by signal {signal}" if signal else f"exited with code {exit_code}"


def restart_wanted(rule: p.RestartRule | None, exit_code: int, signal: int | None, restarts: int) -> bool:
    """The monitor's rule (`monitor._restart_wanted`): `on-failure` restarts any failure,
    `exit-code` a death by signal or an exit code of 128 or more, each at most `max_restarts` times."""
    code = -signal if signal else exit_code
    if rule is None or code == 0 or restarts >= rule.max_restarts:
        return False
    return rule.policy == "on-failure" or (rule.policy == "exit-code" and (code < 0 or code >= 128))


class FakeStream(Stream):
    """A follow stream's handle: closing it ends the events its host is sending."""

    def __init__(self, host: FakeHost) -> None:
        self.host = host
        self.closed = False

    def lines(self) -> Iterator[str]:
        return iter(())

    def send(self, data: bytes) -> None:
        raise AssertionError("a follow stream takes no input")

    def close(self) -> None:
        with self.host.changed:
            self.closed = True
            self.host.changed.notify_all()


@dataclass
class Journal:
    """Every request every fake host received, in order: (host, verb, detail)."""

    entries: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, host: str, verb: str, detail: str = "") -> None:
        with self.lock:
            self.entries.append((host, verb, detail))

    def verbs(self, host: str | None = None) -> list[str]:
        return [verb for h, verb, _ in self.entries if host is None or h == host]

    def index(self, verb: str, detail: str = "") -> int:
        for i, (_, v, d) in enumerate(self.entries):
            if v == verb and (not detail or detail in d.split(",")):
                return i
        raise AssertionError(f"no {verb} {detail} in {self.entries}")


class FakeHost:
    """A simulated host answering `call` with typed answers; `down` makes it unreachable."""

    late = False  # (a real agent's: waiting on a frozen host; closing a fake never waits)

    def __init__(self, host: str, journal: Journal, scripts: dict[str, TaskScript] | None = None) -> None:
        self.host = host
        self.python = "python3"
        self.root = "~/.tfctl"
        self.journal = journal
        self.scripts = scripts if scripts is not None else {}  # the lab's, even while still empty
        self.down = False
        self.cpus = [0, 1, 2, 3]
        self.gpus: list[int] = []  # indices, as CUDA_VISIBLE_DEVICES names them
        self.filesystem = f"fs-{host}"  # the same on hosts that share a home
        self.caches: dict[str, dict[str, tuple[p.FileEntry, bytes]]] = {}  # sync cache -> its files
        self.trees: dict[str, dict[str, bytes]] = {}  # synced workdir -> its files
        self.fail_verbs: dict[str, Exception] = {}
        self.refused: set[str] = set()  # probe targets this host cannot connect to
        self.survivors: list[int] = []  # pids a stop reports surviving SIGKILL (a hung filesystem)
        self.resumable: dict[str, int] = {}  # earlier run -> how many of its files this host still has
        self.before: Callable[[p.Request[Any]], None] | None = None  # runs before each answer
        self.tasks: dict[str, p.TaskInfo] = {}
        self.held: list[int] = []  # ports picked for the run and held until its `stop`
        self.launches: dict[str, p.TaskLaunch] = {}  # as the last start asked
        self.ticks: dict[str, int] = {}
        self.closed = 0
        self.lock = threading.Lock()  # one answer at a time, as one supervisor conversation
        self.changed = threading.Condition()  # notified on every request: follow streams look again
        self.version = 0

    # the HostAgent surface the controller uses

    def call(self, request: p.Request[Any], timeout: float | None = 120, on_note: Any = None) -> Any:
        # on_note: the fake's requests send no notes before their answers
        detail = ",".join(self._names(request))
        self.journal.add(self.host, request.VERB, detail)
        try:
            if self.before is not None:
                self.before(request)
            if self.down:
                raise HostError(self.host, "connection refused")
            if request.VERB in self.fail_verbs:
                raise self.fail_verbs[request.VERB]
            with self.lock:
                return getattr(self, "_" + request.VERB)(request)
        finally:
            self._changed()  # whatever happened, a follow stream looks again (and sees a host gone down)

    def follow(self, request: follow_stream.FollowRequest) -> tuple[Stream, Iterator[follow_stream.FollowEvent]]:
        """Stream the tasks' output from the requested byte offsets, as `supervisor.logs.follow`
        does: chunks of whole lines, each with the offset it ends at; with `follow`, each task's
        end once all its output was sent, and the stream ends when every task has ended."""
        self.journal.add(self.host, "follow", ",".join(sorted(request.tasks)))
        if self.down:
            raise HostError(self.host, "connection refused")
        if "follow" in self.fail_verbs:
            raise self.fail_verbs["follow"]
        stream = FakeStream(self)
        return stream, self._events(request, stream)

    def _wait_change(self, seen: int, stream: FakeStream) -> None:
        """Until the host answered another request (a task may have moved on) or the stream closed."""
        with self.changed:
            self.changed.wait_for(lambda: self.version != seen or stream.closed)

    def _changed(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def _lines(self, name: str) -> list[str]:
        """What the task prints: the words of its command's `echo` lines, as a shell would print
        them (a setup script announces each command so), then its scripted lines."""
        launch = self.launches.get(name)
        echoed = [line[5:] for line in launch.command.splitlines() if line.startswith("echo ")] if launch else []
        return echoed + self.scripts.get(name, TaskScript()).lines

    def _output(self, name: str) -> bytes:
        """What the task printed so far: nothing before it started, all its lines once it did."""
        return "".join(line + "\n" for line in self._lines(name)).encode() if name in self.tasks else b""

    def _start_offsets(self, request: follow_stream.FollowRequest) -> dict[str, int]:
        offsets = dict(request.tasks)
        for name in offsets:
            out = self._output(name)
            if request.tail is not None:
                lines = out.splitlines(keepends=True)
                offsets[name] = max(offsets[name], len(out) - sum(map(len, lines[len(lines) - request.tail :])))
            info = self.tasks.get(name)
            if request.since is not None and info is not None and (info.started_at or 0) < time.time() - request.since:
                offsets[name] = len(out)  # every line was written when the task started
        return offsets

    def _events(self, request: follow_stream.FollowRequest, stream: FakeStream) -> Iterator[follow_stream.FollowEvent]:
        offsets = self._start_offsets(request)
        while offsets and not stream.closed:
            seen, sent = self.version, False
            if self.down:
                raise HostError(self.host, "connection lost")
            for name in sorted(offsets):
                info = self.tasks.get(name)
                out = self._output(name)
                if len(out) > offsets[name]:
                    stamps = [[len(out), info.started_at or 0.0]] if request.times and info else None
                    yield follow_stream.LogChunk(name, len(out), out[offsets[name] :], stamps)
                    offsets[name], sent = len(out), True
                elif request.follow and info is not None and info.state.is_final:
                    yield follow_stream.TaskEnded(name, offsets.pop(name), info.state)
                elif not request.follow:
                    del offsets[name]
            if request.follow and offsets and not sent:
                self._wait_change(seen, stream)

    def close(self) -> None:
        self.closed += 1

    def __enter__(self) -> FakeHost:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # verbs

    @staticmethod
    def _names(request: p.Request[Any]) -> list[str]:
        tasks = getattr(request, "tasks", None)
        if isinstance(tasks, dict):
            return sorted(tasks)
        if isinstance(tasks, list):
            return [t.task if isinstance(t, p.TaskLaunch) else t for t in tasks]
        return []

    def _start(self, request: p.StartRequest) -> p.StartAnswer:
        for launch in request.tasks:
            self.launches[launch.task] = launch
            script = self.scripts.setdefault(launch.task, TaskScript())
            if script.exits_at_start:
                self.tasks[launch.task] = p.TaskInfo(
                    launch.task, p.TaskState.FAILED, exit_code=127, error="could not start: No such file or directory"
                )
            else:
                self.tasks[launch.task] = p.TaskInfo(
                    launch.task, p.TaskState.RUNNING, pid=1000 + len(self.tasks), started_at=time.time()
                )
            self.ticks[launch.task] = 0
            if script.end_after == 0:  # over before its start is answered (a quick command)
                self._advance(launch.task)
        return p.StartAnswer({t.task: self.tasks[t.task] for t in request.tasks})

    def _advance(self, name: str) -> p.TaskInfo:
        info = self.tasks.get(name)
        if info is None:
            return p.TaskInfo(name, p.TaskState.PENDING)
        if info.state is p.TaskState.RESTARTING:  # its backoff is one status request
            info = info.replace(state=p.TaskState.RUNNING, pid=(info.pid or 0) + 1, started_at=time.time())
            self.tasks[name] = info
            return info
        if info.state is not p.TaskState.RUNNING:
            return info
        script = self.scripts[name]
        self.ticks[name] += 1
        tick = self.ticks[name]
        if script.end_after is not None and tick >= script.end_after:
            state = p.TaskState.SUCCEEDED if script.exit_code == 0 and not script.signal else p.TaskState.FAILED
            if restart_wanted(self.launches[name].restart, script.exit_code, script.signal, info.restarts):
                ends = [*info.earlier_ends, end_text(script.exit_code, script.signal)]
                info = info.replace(
                    state=p.TaskState.RESTARTING, listening=False, restarts=len(ends), earlier_ends=ends
                )
                self.scripts[name] = script.after_restart or script
                self.ticks[name] = 0
                self.tasks[name] = info
                return info
            info = info.replace(
                state=state,
                exit_code=None if script.signal else script.exit_code,
                signal=script.signal,
                ended_at=time.time(),
                listening=False,
            )
        else:
            info = info.replace(listening=script.listen_after is not None and tick >= script.listen_after)
        self.tasks[name] = info
        return info

    def _status(self, request: p.StatusRequest) -> p.StatusAnswer:
        tails = {}
        if request.tail:
            tails = self._tail(p.TailRequest(request.run_id, list(request.tasks), request.tail)).tails
        now = time.time()
        infos = {name: self._advance(name) for name in request.tasks}
        if request.progress is not None:
            infos = {name: info.replace(marks=self._marks(name, request.progress, now)) for name, info in infos.items()}
        for name, info in infos.items():
            if name in self.scripts:
                script = self.scripts[name]
                info = infos[name] = info.replace(
                    cpu_seconds=script.cpu_seconds,
                    output_at=now - script.quiet_for if script.lines and name in self.tasks else None,
                    last_line=script.lines[-1] if script.lines and name in self.tasks else info.last_line,
                    output_lines=len(script.lines) if request.count_lines else None,
                )
            samples = self.scripts[name].usage if name in self.scripts else []
            if info.state is p.TaskState.RUNNING and samples:
                shown = samples[-request.usage_history :] if request.usage_history else []
                infos[name] = info.replace(usage=samples[-1], usage_history=shown)
        return p.StatusAnswer(infos, now, tails)

    def _marks(self, name: str, rule: p.ProgressRule, now: float) -> list[p.Mark]:
        """The task's lines that show progress (`supervisor.marks`), one a second up to now (up
        to `quiet_for` seconds ago)."""
        if name not in self.tasks or name not in self.scripts:
            return []
        script = self.scripts[name]
        found = [line for line in script.lines if re.search(rule.pattern, line)]
        return [p.Mark(now - script.quiet_for - len(found) + 1 + i, line) for i, line in enumerate(found)]

    def _stop(self, request: p.StopRequest) -> p.StopAnswer:
        stopped = ended = 0
        for name, info in self.tasks.items():
            if request.tasks is not None and name not in request.tasks:
                continue
            if info.state.is_final:
                ended += 1
            elif info.state in (p.TaskState.RUNNING, p.TaskState.RESTARTING):
                self.tasks[name] = info.replace(state=p.TaskState.STOPPED, listening=False, ended_at=time.time())
                stopped += 1
        ports = {str(port): p.PortInfo(False) for port in request.ports}
        self.held = []
        return p.StopAnswer(stopped, 0, list(self.survivors), ports, dict(self.tasks), ended=ended)

    def _restart(self, request: p.RestartRequest) -> p.RestartAnswer:
        """As a monitor asked to restart its running task: within its restart policy it restarts
        (its end: the request's reason), past it the task ends killed by SIGTERM."""
        asked = [name for name in request.tasks if name in self.tasks and self.tasks[name].state is p.TaskState.RUNNING]
        for name in asked:
            info, rule = self.tasks[name], self.launches[name].restart
            if rule is None or info.restarts >= rule.max_restarts:
                self.tasks[name] = info.replace(state=p.TaskState.FAILED, signal=15, ended_at=time.time())
                continue
            ends = [*info.earlier_ends, request.reason]
            self.tasks[name] = info.replace(state=p.TaskState.RESTARTING, restarts=len(ends), earlier_ends=ends)
            self.scripts[name] = self.scripts[name].after_restart or self.scripts[name]
            self.ticks[name] = 0
        return p.RestartAnswer(asked)

    def _ports(self, request: p.PortsRequest) -> p.PortsAnswer:
        return p.PortsAnswer(
            {str(port): p.PortInfo(port in self.held, [4243] if port in self.held else []) for port in request.ports}
        )

    def _info(self, request: p.InfoRequest) -> p.InfoAnswer:
        gpus = [p.Gpu(i, f"GPU-fake-{self.host}-{i}") for i in self.gpus] if request.gpus else []
        missing = "nvidia-smi: command not found" if request.gpus and not self.gpus else None
        return p.InfoAnswer(
            self.host,
            "3.11.7",
            "3.11.7",
            "tensorflow 2.21.0",
            cpus=list(self.cpus),
            gpus=gpus,
            gpu_error=missing,
            filesystem=self.filesystem,
        )

    def _probe(self, request: p.ProbeRequest) -> p.ProbeAnswer:
        return p.ProbeAnswer(
            {
                target: p.ProbeResult(False, error="refused") if target in self.refused else p.ProbeResult(True)
                for target in request.targets
            }
        )

    def _tail(self, request: p.TailRequest) -> p.TailAnswer:
        return p.TailAnswer({name: self._lines(name)[-request.lines :] for name in request.tasks})

    def _sync_plan(self, request: p.SyncPlanRequest) -> p.SyncPlanAnswer:
        cache = self.caches.get(request.cache, {})
        need = sorted(rel for rel, entry in request.files.items() if rel not in cache or cache[rel][0] != entry)
        return p.SyncPlanAnswer(need, self.filesystem)

    def _sync_apply(self, request: p.SyncApplyRequest) -> p.SyncApplyAnswer:
        """The cache brought up to the manifest with the blobs sent, then copied whole to `dest`."""
        cache = self.caches.setdefault(request.cache, {})
        for rel, blob in request.blobs.items():
            cache[rel] = (request.files[rel], base64.b64decode(blob))
        missing = [rel for rel, entry in request.files.items() if rel not in cache or cache[rel][0] != entry]
        if missing:
            raise HostError(self.host, f"sync cache lacks {', '.join(missing)}")
        self.trees[request.dest] = {rel: cache[rel][1] for rel in request.files}
        return p.SyncApplyAnswer(len(request.blobs), len(request.files), request.dest)

    def _listen(self, request: p.ListenRequest) -> p.ListenAnswer:
        return p.ListenAnswer(4242)

    def _pick_ports(self, request: p.PickPortsRequest) -> p.PickPortsAnswer:
        """The next free ports from 20000 up, as a host with nothing else listening would pick."""
        port = 20000
        while len(self.held) < request.count:
            if port not in request.avoid and port not in self.held:
                self.held.append(port)
            port += 1
        return p.PickPortsAnswer(list(self.held), 4243)

    def _reap(self, request: p.ReapRequest) -> p.ReapAnswer:
        return p.ReapAnswer(0, 0, [], [])

    def _resume(self, request: p.ResumeRequest) -> p.ResumeAnswer:
        """The earlier run's files, as many as the test says this host kept."""
        kept = self.resumable.get(request.resume_from)
        return p.ResumeAnswer(kept is not None, f"~/.tfctl/work/{request.run_id}", copied=kept or 0)

    def _prune(self, request: p.PruneRequest) -> p.PruneAnswer:
        """Every run's files are gone (there are none): nothing kept, nothing to count."""
        return p.PruneAnswer({run: [] for run in request.runs}, {run: 0 for run in request.runs}, {})


def record_of(
    tasks: dict[str, str],
    run_id: str = "fake-run",
    decisive: tuple[str, ...] = ("worker:0",),
    essential: tuple[str, ...] = ("ps:0",),
    port: int = 2222,
) -> RunRecord:
    """A run record for tasks named `job:index` on the given hosts."""
    specs = []
    for i, (name, host) in enumerate(tasks.items()):
        job, index = name.split(":")
        specs.append(TaskSpec(job, int(index), host, port + i, f"train --job_name={job}", {}, None))
    hosts = tuple(HostSpec(h, None, "~/.tfctl", SSHSpec()) for h in sorted(set(tasks.values())))
    return RunRecord(
        run_id, "fake", "/nowhere/cluster.yaml", time.time(), tuple(specs), hosts, 1.0, decisive, essential
    )


def fake_hosts(
    record: RunRecord, journal: Journal, scripts: dict[str, TaskScript] | None = None
) -> dict[str, FakeHost]:
    scripts = scripts or {}
    return {
        h.name: FakeHost(
            h.name, journal, {t.name: scripts.get(t.name, TaskScript()) for t in record.tasks if t.host == h.name}
        )
        for h in record.hosts
    }
