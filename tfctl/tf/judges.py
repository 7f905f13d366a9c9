"""What ends or marks a running run beyond its tasks' states: a task silent while its peers train,
a task hung for good on a wait TF never gives up, a task stalled.

The judges decide on what one closer look at the hosts saw (`Sight`: states, progress and tails
in one request, taken by the driver when the engine's plan asks for it) and on the time the
driver passes in, so each is a table on a fake clock. A judge acts on nothing and asks nothing:
it returns an `engine.reconcile.Ruling`, the run's end or None, the actions it asks for (a line
to say, a `stalled` event, tasks to restart), which the engine hands to the driver with its own,
and what costly parts it wants in the next look (`COUNTED` lines, a `Probe` of a connection)
before it can say more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from tfctl.engine.events import EventKind
from tfctl.engine.observed import TaskStatus
from tfctl.engine.reconcile import Notify, RestartTasks, Ruling, Say
from tfctl.engine.verdicts import Outcome
from tfctl.runs.record import RunRecord, TaskSpec
from tfctl.supervisor.protocol import RunState, TaskState
from tfctl.tf.diagnose import Finding, Kind, diagnose
from tfctl.tf.doctor import HANGS
from tfctl.tf.explain import PeerInfo, explain
from tfctl.tf.progress import RunProgress, TaskProgress
from tfctl.tf.silence import Silence, outputs, silences

COUNTED = "counted lines"  # wanted: every task's output lines counted (costly: each log read whole)


@dataclass(frozen=True)
class Probe:
    """Wanted: whether a task on `source` can open a TCP connection to `address` (host:port)."""

    source: str
    address: str


@dataclass(frozen=True)
class Sight:
    """What one closer look saw: every task's state with its progress read and its last lines,
    what each task does as peers see it, and what the judges wanted of it: the statuses with
    their lines `counted`, the `probes` tried (None: not known)."""

    statuses: Sequence[TaskStatus]
    progress: Mapping[str, TaskProgress]
    peers: Mapping[str, PeerInfo]
    counted: Sequence[TaskStatus] | None = None
    probes: Mapping[Probe, bool | None] = field(default_factory=dict)

    def running(self) -> list[TaskStatus]:
        return [s for s in self.statuses if s.state is TaskState.RUNNING]


SightJudge = Callable[[Sight, float], Ruling]


class SilenceJudge:
    """Tells, once, of a task that has printed nothing for `limit` seconds while a task of its job
    went on (`tf.silence`: with TF's defaults nothing else tells), and remembers every silence
    of `silence.AT_END` seconds or more for `HangJudge`: a task that later hangs waiting for a
    peer that finished (a retry of its session) hangs because of it. Never ends a run itself."""

    def __init__(self, progress: RunProgress, limit: float) -> None:
        self.progress = progress
        self.limit = limit
        self.seen: dict[str, Silence] = {}  # task -> its silence, until it logs a step
        self._told: set[str] = set()

    def __call__(self, sight: Sight, now: float) -> Ruling:
        quiet = self._silences(sight.statuses, sight.progress)
        due = {t for t, s in quiet.items() if s.quiet >= self.limit and t not in self._told}
        if set(quiet) - set(self.seen) or due:  # count the lines for the words, when they are said
            if sight.counted is None:
                return Ruling(wants=frozenset({COUNTED}))
            quiet = self._silences(sight.counted, self.progress.assess(sight.counted))
            self.seen.update(quiet)
        for task in [t for t in self.seen if t in sight.progress and sight.progress[t].step is not None]:
            del self.seen[task]  # it steps now: that silence was a slow start (kept in place: HangJudge reads it)
        said = []
        for task, silence in quiet.items():
            if silence.quiet >= self.limit and task not in self._told:
                self._told.add(task)
                said.append(Say(f"note: {silence.text(ended=False)}; {silence.cause}\n  fix: {silence.fix}"))
        return Ruling(actions=tuple(said))

    @staticmethod
    def _silences(looked: Sequence[TaskStatus], progress: Mapping[str, TaskProgress]) -> dict[str, Silence]:
        observed = max((s.observed_at for s in looked if s.observed_at is not None), default=0.0)
        return silences(outputs(looked, progress, {}), observed)


class HangJudge:
    """Ends a run whose task has waited on a peer for longer than `limit` seconds (`now`, as the
    driver's clock reads it).

    TF never gives up on its own: CreateSession waits forever, and so do non-chief workers
    whose chief finished and MWMS workers missing a peer. A task that was silent while its peers
    trained (`silent`, from `SilenceJudge`) hangs because it never trained: that is the cause
    given, not the wait its retry shows now.
    """

    def __init__(self, limit: float, *, silent: Mapping[str, Silence] | None = None) -> None:
        self.limit = limit
        self.silent = silent if silent is not None else {}
        self._first_seen: dict[tuple[str, Kind], float] = {}

    def __call__(self, sight: Sight, now: float) -> Ruling:
        waiting: dict[tuple[str, Kind], Finding] = {}
        for s in sight.running():
            for finding in diagnose(s.task, list(s.tail or ())):
                if finding.kind in HANGS:
                    waiting[(s.task, finding.kind)] = finding
        self._first_seen = {key: self._first_seen.get(key, now) for key in waiting}
        for key, since in self._first_seen.items():
            if now - since >= self.limit:
                silence = self.silent.get(key[0])
                if silence is not None:
                    cause, fix = f"{silence.text()}; {silence.cause}", silence.fix
                else:
                    wanted: set[Probe] = set()
                    finding = explain(waiting[key], sight.peers, _tried(sight, wanted))
                    if wanted:
                        return Ruling(wants=frozenset(wanted))
                    cause, fix = finding.cause, finding.fix
                why = f"{key[0]} has been stuck for over {self.limit:g}s: {cause} (fix: {fix})"
                return Ruling(Outcome(RunState.FAILED, why, key[0]))
        return Ruling()


def _tried(sight: Sight, wanted: set[Probe]) -> Callable[[str, str], bool | None]:
    """`explain`'s reachability, read from the probes the look tried; one not tried is `wanted`."""

    def reachable(source: str, address: str) -> bool | None:
        probe = Probe(source, address)
        if probe not in sight.probes:
            wanted.add(probe)
        return sight.probes.get(probe)

    return reachable


class StallJudge:
    """Judges tasks `status` would flag `stalled` (`progress.on_stall`): `fail` ends the run
    naming the first; `warn` and `restart` tell of it once per stall (a task that steps again and
    stalls later is told again) and let the run go on, and `restart` asks to restart the running
    tasks of the stalled task's job, within their restart policy. A run nobody watches is where
    this matters: the controller looks, not a user."""

    def __init__(self, tasks: Sequence[TaskSpec], progress: RunProgress, action: str) -> None:
        self.tasks, self.progress, self.action = list(tasks), progress, action
        self._told: set[str] = set()

    def __call__(self, sight: Sight, now: float) -> Ruling:
        stalled = [s for s in sight.running() if "stalled" in sight.progress[s.task].flags]
        self._told &= {s.task for s in stalled}
        actions: list[Say | Notify | RestartTasks] = []
        for s in stalled:
            if s.task in self._told:
                continue
            quiet = sight.progress[s.task].quiet_for or 0.0
            why = f"stalled: no step for {quiet:.0f}s (progress.stall_timeout {self.progress.stall_timeout:g}s)"
            reason = f"{s.task} on {s.host} {why}"
            if self.action == "fail":
                return Ruling(Outcome(RunState.FAILED, f"{reason}; on_stall: fail", s.task), tuple(actions))
            self._told.add(s.task)
            if self.action == "restart":
                running = {r.task for r in sight.running()}
                again = tuple(t for t in self.tasks if t.job == s.job and t.name in running)
                self._told.update(t.name for t in again)  # its job's other stalled tasks restart with it
                actions.append(RestartTasks(again, why))
                done = f"restarting {', '.join(t.name for t in again)} (progress.on_stall: restart)"
            else:
                done = "the run goes on (progress.on_stall: warn)"
            actions += [Say(f"warning: {reason}; {done}"), Notify(EventKind.STALLED, reason, s.task)]
        return Ruling(actions=tuple(actions))


def run_judges(record: RunRecord, progress: RunProgress) -> list[SightJudge]:
    """The judges of a run, in the order they are asked: a silence and a hang (with
    `hang_timeout`), then a stall (`progress.on_stall`)."""
    judges: list[SightJudge] = []
    if record.hang_timeout:
        silence = SilenceJudge(progress, record.hang_timeout)
        judges += [silence, HangJudge(record.hang_timeout, silent=silence.seen)]
    judges.append(StallJudge(record.tasks, progress, record.progress.on_stall))
    return judges
