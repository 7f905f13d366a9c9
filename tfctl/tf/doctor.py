"""Diagnosis of a live run: each task's TF log findings, explained with what tfctl knows.

`diagnose.py` reads lines (`log_lines.py` one at a time); this module fetches them from the
hosts, asks the cluster about peers and reachability, fails runs that hang for good, and
produces the live notes `up` and `logs -f` print when a known pattern appears.
"""

from __future__ import annotations

import collections
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

from tfctl.cluster.cluster import Cluster
from tfctl.engine.observed import TaskStatus
from tfctl.supervisor.protocol import TaskState
from tfctl.tf.diagnose import (
    CLEARED_BY_PROGRESS,
    WAITS,
    Finding,
    Kind,
    diagnose,
    match_line,
    moved_on,
    session_state,
)
from tfctl.tf.explain import PeerInfo, explain, is_news
from tfctl.tf.log_lines import last_meaningful
from tfctl.tf.progress import RunProgress
from tfctl.tf.silence import Output, Silence, silences

TAIL_LINES = 200
HANGS = WAITS  # kinds that fail a run once they last
NOTE_EVERY = 30.0  # seconds before the same finding of the same task is noted again
# How long a finding must stand before it becomes a note: waits end by themselves in healthy runs
# (a peer connecting 1 s late; TF's own 30 s "Waiting for model" loop), and a failure line seen
# as a run ends normally (a cancelled step when the ps is stopped) is no news.
HOLD = {Kind.WAITING_FOR_PEER: 30.0, Kind.MWMS_WAITING: 30.0, Kind.WAITING_FOR_MODEL: 65.0, Kind.STEP_CANCELLED: 10.0}
FAILURE_HOLD = 2.0
# A model wait TF repeats while another task has moved on is no start-up race: noted after this.
REPEATED_HOLD = 2.0


def peers(statuses: Sequence[TaskStatus]) -> dict[str, PeerInfo]:
    return {s.task: PeerInfo.from_status(s) for s in statuses}


def peers_now(cluster: Cluster) -> dict[str, PeerInfo]:
    """Every task as it is now, with whether it trains (its recent progress lines, or TF's)."""
    statuses, _ = cluster.status(progress=RunProgress(cluster.record.progress).rule(), tail=TAIL_LINES)
    return known_peers(cluster, statuses)


def known_peers(cluster: Cluster, statuses: Sequence[TaskStatus]) -> dict[str, PeerInfo]:
    """`peers_now` of statuses asked with their tails."""
    return _known(cluster, statuses, {s.task: list(s.tail) for s in statuses if s.tail is not None})


def _known(cluster: Cluster, statuses: Sequence[TaskStatus], tails: dict[str, list[str]]) -> dict[str, PeerInfo]:
    """Every task's PeerInfo; `trains` also when its tail shows progress or its session up, as TF says."""
    steps = re.compile(RunProgress(cluster.record.progress).rule().pattern, re.MULTILINE)
    return {
        task: replace(
            p, trains=p.trains or any(map(steps.search, tails.get(task, ()))) or moved_on(task, tails.get(task, ()))
        )
        for task, p in peers(statuses).items()
    }


@dataclass(frozen=True)
class RunDiagnosis:
    findings: dict[str, Finding]  # task -> its most important finding, explained
    last_lines: dict[str, str]  # task -> last line that is not TF noise
    never_ready: dict[str, Finding] = field(default_factory=dict)  # ended task -> the wait it ended in


def diagnose_run(
    cluster: Cluster, statuses: Sequence[TaskStatus], waited: Mapping[str, Finding] | None = None
) -> RunDiagnosis:
    """Findings for every task that runs or ended badly, and each task's last meaningful line.
    `waited`: the waits seen live that no later line ended (`LiveNotes.waited`), for an ended
    task whose tail no longer shows its wait (its last error, once its peer left, pushed it out)."""
    names = [s.task for s in statuses if s.state not in (TaskState.PENDING, TaskState.UNREACHABLE)]
    given = {s.task: list(s.tail) for s in statuses if s.tail is not None}  # asked with the status
    missing = [name for name in names if name not in given]
    tails = {**given, **(cluster.tails(missing, TAIL_LINES) if missing else {})}
    tails = {name: tails[name] for name in names if name in tails}
    known = _known(cluster, statuses, tails)
    findings, never_ready = {}, {}
    for s in statuses:
        if not tails.get(s.task):
            continue
        if s.state is TaskState.RUNNING or s.state.is_bad:
            found = [f for f in diagnose(s.task, tails[s.task]) if is_news(f, known)]
            if found:
                findings[s.task] = explain(found[0], known, cluster.reachable)
        if s.state.is_final:
            waits = [f for f in diagnose(s.task, tails[s.task]) if f.kind in WAITS] or (
                [waited[s.task]] if waited and s.task in waited and s.state is not TaskState.SUCCEEDED else []
            )
            if waits:
                never_ready[s.task] = explain(waits[0], known, cluster.reachable)
    meaningful = {task: last_meaningful(lines) or "" for task, lines in tails.items()}
    return RunDiagnosis(findings, meaningful, never_ready)


class LiveNotes:
    """Watches log lines as they stream and explains the known TF patterns that last.

    A finding is held for `HOLD` seconds (`FAILURE_HOLD` for failures) and becomes a note only
    if the task's recent lines still show it then: a wait that later lines end, or anything
    seen while the run ends normally (the caller stops asking), is never a warning.
    """

    def __init__(self, cluster: Cluster, clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.clock = clock
        self._recent: dict[str, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=50))
        self._pending: dict[tuple[str, Kind], float] = {}  # (task, kind) -> when first seen
        self._noted: dict[tuple[str, Kind], float] = {}
        self._moved_on: dict[str, bool] = {}  # task -> its session is up, by its newest line that tells
        self._noted_waits: dict[str, Finding] = {}  # task -> the last wait it was noted for
        self._up_until_failing: dict[str, bool] = {}  # task -> its session state, by lines before a failure
        self._failing: set[str] = set()  # tasks that printed a failure or a traceback: what follows is no progress
        self._printed: dict[str, tuple[int, float]] = {}  # task -> (lines so far, when the last came)
        self.silent: dict[str, Silence] = {}  # tasks seen silent while a peer of their job printed on

    def feed(self, task: str, line: str) -> None:
        lines, _ = self._printed.get(task, (0, 0.0))
        self._printed[task] = (lines + 1, self.clock())
        recent = self._recent[task]
        previous = recent[-1] if recent else ""
        recent.append(line)
        hit = match_line(task, line)
        if hit is not None:
            self._pending.setdefault((task, hit.kind), self.clock())
        if (hit is not None and hit.kind not in CLEARED_BY_PROGRESS) or line.startswith(
            "Traceback (most recent call last):"
        ):
            self._failing.add(task)
        state = session_state(line, hit, previous)
        if state is not None:
            self._moved_on[task] = state
            if task not in self._failing:
                self._up_until_failing[task] = state

    def forget(self, tasks: Iterable[str]) -> None:
        """These tasks start anew (moved, restarted with a move, a new allocation): what their
        earlier run printed says nothing of the new one."""
        for task in tasks:
            self._recent.pop(task, None)
            self._printed.pop(task, None)  # (its count and last line went with `_recent`)
            self.silent.pop(task, None)
            self._moved_on.pop(task, None)
            self._noted_waits.pop(task, None)
            self._up_until_failing.pop(task, None)
            self._failing.discard(task)
            for key in [key for key in self._pending if key[0] == task]:
                del self._pending[key]

    @property
    def waited(self) -> dict[str, Finding]:
        """The tasks noted waiting whose lines never showed them past it, up to a failure of theirs
        (a task's error output, once its peer has gone, says nothing of its session)."""
        return {t: f for t, f in self._noted_waits.items() if not self._up_until_failing.get(t, False)}

    def _note_silences(self, now: float) -> None:
        """Remember who went quiet while a peer of its job printed on (`tf.silence`): a wait it
        shows later (its session's retry, once that peer has left) is not the story, its silence is."""
        printed = [
            Output(task, task.split(":")[0], TaskState.RUNNING, None, lines, at, self._recent[task][-1])
            for task, (lines, at) in self._printed.items()
        ]
        self.silent.update(silences(printed, now))  # the longest each was; kept once it prints again

    def due(self) -> list[tuple[str, Finding]]:
        """The findings held long enough that the task's recent lines still show, explained."""
        now, out = self.clock(), []
        self._note_silences(now)
        for (task, kind), since in list(self._pending.items()):
            if now - since < HOLD.get(kind, FAILURE_HOLD) and not self._repeated_while_others_moved_on(task, kind):
                continue
            del self._pending[(task, kind)]
            if now - self._noted.get((task, kind), -NOTE_EVERY) < NOTE_EVERY:
                continue
            found = [f for f in diagnose(task, self._recent[task]) if f.kind is kind]
            if not found:
                continue  # later lines ended it
            now_peers = {
                name: replace(p, trains=True) if self._moved_on.get(name) else p
                for name, p in peers_now(self.cluster).items()
            }
            if not is_news(found[0], now_peers):
                continue
            self._noted[(task, kind)] = now
            if kind in WAITS:
                self._noted_waits[task] = found[0]
            silence = self.silent.get(task) if kind in WAITS else None
            if silence is not None:
                told = f"{silence.text(ended=False, named=False)}; {silence.cause}"
                out.append((task, replace(found[0], cause=told, fix=silence.fix)))
            else:
                out.append((task, explain(found[0], now_peers, self.cluster.reachable)))
        return out

    def _repeated_while_others_moved_on(self, task: str, kind: Kind) -> bool:
        """A model wait said again while another task's session is up: the Hogwild hang, not a
        non-chief started a little before its chief (that one waits once, then goes on)."""
        if kind is not Kind.WAITING_FOR_MODEL or not any(up for t, up in self._moved_on.items() if t != task):
            return False
        found = [f for f in diagnose(task, self._recent[task]) if f.kind is kind]
        return bool(found) and found[0].repeats >= 2 and self.clock() - self._pending[(task, kind)] >= REPEATED_HOLD


def finding_json(finding: Finding | None) -> dict | None:
    if finding is None:
        return None
    return {
        "kind": finding.kind.value,
        "cause": finding.cause,
        "fix": finding.fix,
        "evidence": finding.evidence,
        "peer": finding.peer,
    }
