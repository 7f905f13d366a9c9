"""The decisions about a running run, one look at a time, on the time the driver passes in.

A look is what every host answered (or that it did not) to one status request. From it and the
looks before, `Supervision` says what to do: note the silent hosts, move a lost host's tasks to a
spare, end the run (and how), or ask the judges (hang, stall, backend), whose verdict it takes
last. It keeps the only state these decisions need (since when each host has been silent), so
the races that used to hide between threads are replayed here as tables, step by step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from tfctl.engine.observed import TaskStatus
from tfctl.engine.verdicts import Outcome, decide
from tfctl.supervisor.protocol import RunState, TaskState


@dataclass(frozen=True)
class Look:
    """One look at every host. `began`: when it was asked (monotonic), so a host's silence counts
    from the start of the first look it did not answer, however long that look waited for it.
    `silent`: host -> why it did not answer. `can_move`: a spare is left, and a mover to use it."""

    began: float
    statuses: Sequence[TaskStatus]
    silent: Mapping[str, str] = field(default_factory=dict)
    can_move: bool = False


@dataclass(frozen=True)
class Move:
    """Move `host`'s tasks to a spare; `ended`: tasks elsewhere that ended badly meanwhile, which
    start again with the move."""

    host: str
    why: str
    ended: tuple[str, ...] = ()


@dataclass(frozen=True)
class End:
    outcome: Outcome


Verdict = Union[Move, End]


@dataclass(frozen=True)
class Step:
    """What one look decided. `silence`: the silent hosts and since when (epoch), when they
    changed; `verdict`: a move or the run's end; `ask_judges`: states decide nothing, the judges
    may; `lost`: a host was lost this look (the tasks' states were not weighed)."""

    silence: dict[str, float] | None = None
    verdict: Verdict | None = None
    ask_judges: bool = False
    lost: bool = False


class Supervision:
    """The decisions of one run's supervision; no I/O, no clock of its own."""

    def __init__(self, decisive: Sequence[str], essential: Sequence[str], host_patience: float) -> None:
        self.decisive, self.essential = tuple(decisive), tuple(essential)
        self.host_patience = host_patience
        self._since: dict[str, float] = {}  # host -> when the first look it did not answer began

    def observe(self, look: Look, now: float, wall: float) -> Step:
        """The decision on `look`, seen at `now` (monotonic) and `wall` (epoch)."""
        before = set(self._since)
        self._since = {host: self._since.get(host, look.began) for host in look.silent}
        silence = None
        if set(self._since) != before:
            silence = {host: wall - (now - since) for host, since in self._since.items()}
        lost = self._lost(look, now, wall)
        if lost is not None:
            host, why = lost
            if look.can_move:
                return Step(silence, Move(host, why, self._ended_badly(look.statuses, host)), lost=True)
            return Step(silence, End(Outcome(RunState.FAILED, why, silent=self._judged_silent(now))), lost=True)
        outcome = decide(look.statuses, self.decisive, self.essential)
        if outcome is not None and outcome.state is RunState.FAILED and look.silent and look.can_move:
            outcome = None  # the silent host's verdict first: its silence is likely why the task failed
        if outcome is not None:
            return Step(silence, End(outcome))
        return Step(silence, ask_judges=True)

    def move_failed(self, move: Move) -> End:
        """No spare could take the lost host's tasks: the run fails as it would without spares."""
        return End(Outcome(RunState.FAILED, move.why, silent=(move.host,) if move.host in self._since else ()))

    @staticmethod
    def cancelled(reason: str) -> End:
        """Supervision told to end (`down`, SIGTERM, the end of an attached `up`): stopped, by it."""
        return End(Outcome(RunState.STOPPED, reason or "supervision cancelled"))

    def _lost(self, look: Look, now: float, wall: float) -> tuple[str, str] | None:
        """The first host lost, and why in words: silent for longer than the patience, or a task
        of it lost (its monitor gone without a word: the host rebooted)."""
        for host, began in self._since.items():
            if now - began > self.host_patience:
                when = time.strftime("%H:%M:%S", time.localtime(wall - (now - began)))
                why = f"lost contact with {host} since {when} ({self.host_patience:g}s, host_timeout)"
                return host, f"{why}: {look.silent[host]}"
        for s in look.statuses:
            if s.state is TaskState.LOST:
                return s.host, f"{s.task} on {s.host} {s.describe_end()}"
        return None

    def _judged_silent(self, now: float) -> tuple[str, ...]:
        return tuple(sorted(h for h, began in self._since.items() if now - began > self.host_patience))

    def _ended_badly(self, statuses: Sequence[TaskStatus], lost: str) -> tuple[str, ...]:
        """The tasks off the lost host whose end `decide` would fail the run for."""
        return tuple(
            s.task for s in statuses if s.host != lost and (s.state.is_bad or (s.task in self.essential and s.final))
        )
