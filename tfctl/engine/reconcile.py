"""One step of a running run's reconciliation: what one look saw goes in; the actions to carry
out, and when and how to look next, come out.

The driver (`cluster.control.supervise`) takes the look the last `Plan` asked for: every task's
state, and when due the judges' closer look (tails and progress, in the same request) and the
backend's word on the run's allocation. `Reconciler.step` decides on it at the time passed in:
note the silent hosts, tell `notify:` of restarts and stalls, restart tasks, move a lost host's
tasks, ask the hosts the run left to stop what it ran there and strike them off, end the run.
What TensorFlow's logs mean stays in `tf/judges.py`, passed in as judges that return a
`Ruling`; nothing here does I/O or reads a clock, so every case is a row of a table
(`tests/test_engine_reconcile.py`). Requests whose answers take long (a left host asked to
stop) are sent by the driver on their own and answered in a later look.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, Hashable, Mapping, Sequence, TypeVar, Union

from tfctl.engine import retiring
from tfctl.engine.events import EventKind
from tfctl.engine.live_run import End, Look, Move, Supervision
from tfctl.engine.observed import TaskStatus
from tfctl.engine.retiring import LeftBehind, Retiring
from tfctl.engine.verdicts import Outcome
from tfctl.runs.record import TaskSpec
from tfctl.supervisor.protocol import RunState, TaskState

# How often a run's controller asks every host how its tasks are, for the run's whole life. Each
# ask costs the host a supervisor request and the controller an SSH round trip: at 0.5 s that was
# a quarter of what a logging 3-host run took from training (0.014 of a core); a run's end is now
# noticed within a second rather than half of one.
SUPERVISE_POLL = 1.0
# How often that look also reads the tails and progress the judges weigh (a costlier answer).
JUDGE_EVERY = 5.0
# How often the backend is asked whether the run's allocation still holds (a scheduler query).
ALLOCATION_EVERY = 5.0


@dataclass(frozen=True)
class NoteSilence:
    """Record the silent hosts, and since when (epoch), for `status` to show."""

    since: Mapping[str, float]


@dataclass(frozen=True)
class Say:
    """A line for whoever watches the run (the attached terminal, the watcher's log)."""

    text: str


@dataclass(frozen=True)
class Notify:
    """An event for the `notify:` commands."""

    kind: EventKind
    reason: str
    task: str | None = None

    @classmethod
    def of_end(cls, outcome: Outcome) -> Notify:
        """The event of a run that ended with `outcome`."""
        return cls(EventKind.of_end(outcome.state), outcome.reason, outcome.culprit)


@dataclass(frozen=True)
class AskToStop:
    """Ask a host the run left (its tasks moved) to stop what the run ran there; its answer
    comes with a later look (`Seen.left_behind`)."""

    host: str


@dataclass(frozen=True)
class StrikeOff:
    """A host the run left has stopped all the run had there: off the record's lost hosts."""

    host: str


@dataclass(frozen=True)
class RestartTasks:
    """Have the tasks' monitors start them again (within their restart policy)."""

    tasks: tuple[TaskSpec, ...]
    why: str


Action = Union[NoteSilence, Say, Notify, RestartTasks, AskToStop, StrikeOff, Move, End]


@dataclass(frozen=True)
class Ruling:
    """What a judge says of one closer look: how the run ends (None: it goes on), what to do
    (lines to say, events to tell, tasks to restart), and what it `wants` in the next closer look
    before it can say more (opaque here: `tf.judges` names them; the driver fetches them)."""

    outcome: Outcome | None = None
    actions: tuple[Say | Notify | RestartTasks, ...] = ()
    wants: frozenset[Hashable] = frozenset()


S = TypeVar("S")  # the judges' closer look (`tf.judges.Sight`): opaque here
SightJudge = Callable[[S, float], Ruling]


@dataclass(frozen=True)
class Seen(Generic[S]):
    """One look, as the last plan asked for it. `sight`: the judges' closer look, when asked;
    `allocation_asked`: the backend was asked of the allocation, and `allocation_end` is its
    words for the allocation's end (None: it holds); `cancelled`: why the run was told to end
    while the look was under way (a `down`, SIGTERM), if it was."""

    look: Look
    sight: S | None = None
    allocation_asked: bool = False
    allocation_end: str | None = None
    cancelled: str | None = None
    left: tuple[str, ...] = ()  # the hosts the run left, as its record lists them (`lost_hosts`)
    left_behind: Mapping[str, LeftBehind | None] = field(default_factory=dict)  # their answers since: None, silent


@dataclass(frozen=True)
class Plan:
    """What a step decided: the actions, in order, and the next look: after `look_again_in`
    seconds, with the judges' `sight` (and in it what they `want`) and the backend's word on the
    `allocation` when asked."""

    actions: tuple[Action, ...] = ()
    look_again_in: float = 0.0
    sight: bool = False
    allocation: bool = False
    wants: frozenset[Hashable] = frozenset()

    @property
    def end(self) -> End | None:
        return next((a for a in self.actions if isinstance(a, End)), None)

    @property
    def move(self) -> Move | None:
        return next((a for a in self.actions if isinstance(a, Move)), None)


@dataclass(frozen=True)
class Rules(Generic[S]):
    """What a run is reconciled by: which tasks decide it and which may not end while it runs,
    how long a host may be silent, how many restarts each task's policy allows (for the words of
    a `restarted` event), and the judges of the closer look, asked in order."""

    decisive: Sequence[str]
    essential: Sequence[str]
    host_patience: float
    max_restarts: Mapping[str, int] = field(default_factory=dict)
    judges: Sequence[SightJudge[S]] = ()


class Reconciler(Generic[S]):
    """The decisions of one run's supervision, a look at a time; no I/O, no clock of its own.
    It keeps what they need from the looks before: since when each host is silent (in
    `Supervision`), each task's restarts seen, when the judges and the backend were last asked,
    and each left host's retirement."""

    def __init__(self, rules: Rules[S]) -> None:
        self.rules = rules
        self.supervision = Supervision(rules.decisive, rules.essential, rules.host_patience)
        self._restarts: dict[str, int] = {}
        self._judged: float | None = None
        self._allocation_asked: float | None = None
        self._retiring: dict[str, Retiring] = {}  # a host the run left -> its retirement so far
        self._next_ask: dict[str, float] = {}  # -> when to ask it to stop next (absent: asked, or done)

    def first(self) -> Plan:
        """The first look: at once, with all there is to ask."""
        return Plan(sight=bool(self.rules.judges), allocation=True)

    def step(self, seen: Seen[S], now: float, wall: float) -> Plan:
        """The decision on `seen`, read at `now` (monotonic) and `wall` (epoch)."""
        if seen.cancelled is not None:
            return Plan((self.cancelled(seen.cancelled),))
        if seen.allocation_asked:
            self._allocation_asked = now
        looked = self.supervision.observe(seen.look, now, wall)
        actions: list[Action] = self._retire(seen, now)
        if looked.silence is not None:
            actions.append(NoteSilence(looked.silence))
        if isinstance(looked.verdict, Move):
            return Plan((*actions, looked.verdict))  # carried out, then looked at again at once
        if not looked.lost:
            actions += self._restarted(seen.look.statuses)
        verdict = looked.verdict
        if verdict is None and looked.ask_judges and seen.allocation_end is not None:
            verdict = End(Outcome(RunState.FAILED, seen.allocation_end))
        wants: frozenset[Hashable] = frozenset()
        if verdict is None and looked.ask_judges and seen.sight is not None:
            outcome, said, wants = self._judge(seen.sight, seen.look.statuses, now)
            actions += said
            verdict = None if outcome is None else End(outcome)
        if verdict is not None:
            return Plan((*actions, verdict))
        return Plan(
            tuple(actions),
            0.0 if wants else SUPERVISE_POLL,  # a judge waits on what it wants: fetched at once
            sight=bool(wants) or (bool(self.rules.judges) and self._due(self._judged, JUDGE_EVERY, now)),
            allocation=self._due(self._allocation_asked, ALLOCATION_EVERY, now),
            wants=wants,
        )

    def move_failed(self, move: Move) -> End:
        """No spare could take the lost host's tasks: the run fails as it would without spares."""
        return self.supervision.move_failed(move)

    def cancelled(self, reason: str) -> End:
        return self.supervision.cancelled(reason)

    def _due(self, last: float | None, every: float, now: float) -> bool:
        """Due by the next look (SUPERVISE_POLL from `now`)."""
        return last is None or now + SUPERVISE_POLL - last >= every

    def _judge(
        self, sight: S, statuses: Sequence[TaskStatus], now: float
    ) -> tuple[Outcome | None, list[Say | Notify | RestartTasks], frozenset[Hashable]]:
        """The judges on the closer look, while a task runs; the first verdict wins, and the
        actions of every ruling up to it are kept, in order, with what they all want next."""
        if not any(s.state is TaskState.RUNNING for s in statuses):
            return None, [], frozenset()
        self._judged = now
        said: list[Say | Notify | RestartTasks] = []
        wants: frozenset[Hashable] = frozenset()
        for judge in self.rules.judges:
            ruling = judge(sight, now)
            said += ruling.actions
            wants |= ruling.wants
            if ruling.outcome is not None:
                return ruling.outcome, said, frozenset()
        return None, said, wants

    def _retire(self, seen: Seen[S], now: float) -> list[Action]:
        """Each host the run left is asked to stop what it ran there every RETIRE_POLL seconds
        (`engine.retiring` weighs each answer) until it has, then struck off the record."""
        actions: list[Action] = []
        for host, answer in seen.left_behind.items():
            state = self._retiring.get(host)
            if state is None:
                continue
            step = retiring.after_stop_asked(state, answer)
            self._retiring[host] = step.state
            if step.say is not None:
                actions.append(Say(step.say))
            if step.strike_off:
                actions.append(StrikeOff(host))
            if step.ask_again_in is not None:
                self._next_ask[host] = now + step.ask_again_in
        for host in seen.left:
            if host not in self._retiring:
                self._retiring[host] = Retiring(host)
                self._next_ask[host] = now + retiring.RETIRE_POLL
        for host, at in sorted(self._next_ask.items()):
            if host not in seen.left:
                del self._next_ask[host]  # struck off
            elif at <= now:
                del self._next_ask[host]
                actions.append(AskToStop(host))
        return actions

    def _restarted(self, statuses: Sequence[TaskStatus]) -> list[Action]:
        """A `restarted` event for each restart a task's monitor made since the first look (a new
        controller of a running run does not report the restarts before it)."""
        told: list[Action] = []
        for s in statuses:
            if s.state is TaskState.UNREACHABLE:
                continue  # says nothing of its restarts
            before = self._restarts.get(s.task)
            self._restarts[s.task] = s.restarts
            if before is None or s.restarts <= before:
                continue
            limit = self.rules.max_restarts.get(s.task)
            of = f" of {limit}" if limit is not None else ""
            end = s.earlier_ends[-1] if s.earlier_ends else "ended"
            told.append(Notify(EventKind.RESTARTED, f"{s.task} on {s.host} {end}; restart {s.restarts}{of}", s.task))
        return told
