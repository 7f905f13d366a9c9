"""Moving a lost host's tasks to a spare, decided from the run's record alone: which spare, each
moved task's new spec, which tasks elsewhere start again with the new address (`plan_move`), and,
when a move fails, whether the next spare takes them (`after_failed_move`).

What a move means to TensorFlow (who must restart, how an address is rewritten) is not known
here: the live controller passes it in as `MoveRules` (`tf/moves.py`), and carries the plan out
(`controller/live/spares.py`). Tested as tables in `tests/test_engine_moving.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from tfctl.config.model import host_port
from tfctl.engine.events import EventKind
from tfctl.engine.reconcile import Notify, Say
from tfctl.runs.record import Move, RunRecord, TaskSpec


class MoveRules(Protocol):
    """What a move means to the tasks' framework (for TensorFlow: `tfctl.tf.moves`)."""

    def peers_to_restart(self, tasks: Sequence[TaskSpec], moved: str) -> list[str]: ...

    def readdressed(self, task: TaskSpec, swaps: Mapping[str, str]) -> TaskSpec: ...


@dataclass(frozen=True)
class MovePlan:
    """What moving the lost host's tasks to a spare changes: the tasks as they will run."""

    lost: str
    spare: str
    why: str
    moved: tuple[TaskSpec, ...]  # the lost host's tasks, now on the spare
    restarted: tuple[TaskSpec, ...]  # tasks elsewhere started again with the new addresses
    tasks: tuple[TaskSpec, ...]  # every task of the run after the move
    ended: tuple[str, ...] = ()  # tasks that ended badly while the lost host was silent: among `restarted`

    def record_moves(self, at: float) -> tuple[Move, ...]:
        restarted = tuple(t.name for t in self.restarted)
        return tuple(Move(at, t.name, self.lost, self.spare, self.why, restarted) for t in self.moved)

    def announced(self) -> tuple[Say, ...]:
        """What is said as the move begins: why, where to, and which tasks start again."""
        moved = ", ".join(t.name for t in self.moved)
        said = [Say(f"{self.why}: moving {moved} to spare {self.spare}")]
        if self.ended:
            said.append(
                Say(f"{', '.join(self.ended)} ended while {self.lost} was silent: starting again with the move")
            )
        readdressed = [t.name for t in self.restarted if t.name not in self.ended]
        if readdressed:
            said.append(Say(f"restarting {', '.join(readdressed)}: their cluster names the new address"))
        return tuple(said)

    def told(self) -> tuple[Notify, ...]:
        """The `moved` events, one a task, once the moved tasks run on the spare."""
        return tuple(
            Notify(EventKind.MOVED, f"{t.name} moved from {self.lost} to {self.spare}: {self.why}", t.name)
            for t in self.moved
        )


def plan_move(
    record: RunRecord,
    host: str,
    why: str,
    rules: MoveRules,
    restart_all: bool = False,
    ended: tuple[str, ...] = (),
) -> MovePlan | None:
    """The move of `host`'s tasks to the first spare left; None when there is none (or the host
    runs no task): the run fails as it would without spares. `restart_all`: every other task
    starts again too (a failed move stopped them all); `ended`: these start again too (they
    failed while the host was silent). `rules` says what a move means to the tasks' framework."""
    lost = [t for t in record.tasks if t.host == host]
    if not record.spares or not lost:
        return None
    spare = record.spares[0]
    swaps = {t.address: host_port(spare, t.port) for t in lost}
    names = {t.name for t in lost}
    peers = (
        {t.name for t in record.tasks}
        if restart_all
        else {peer for t in lost for peer in rules.peers_to_restart(record.tasks, t.name)}
    )
    again = (peers | set(ended)) - names
    tasks = tuple(
        rules.readdressed(t, swaps).replace(host=spare)
        if t.name in names
        else rules.readdressed(t, swaps)
        if t.name in again
        else t
        for t in record.tasks
    )
    return MovePlan(
        host,
        spare,
        why,
        tuple(t for t in tasks if t.name in names),
        tuple(t for t in tasks if t.name in again),
        tasks,
        tuple(name for name in ended if name in again),
    )


@dataclass(frozen=True)
class NextMove:
    """After a failed move, the move to try next: the failed spare is lost in its turn."""

    host: str
    why: str
    restart_all: bool = True  # the failure stopped every task: all start again


def after_failed_move(plan: MovePlan, spare_took: bool, spare_answers: bool, error: str) -> NextMove | None:
    """A move that failed with `error`: the next spare takes the tasks when the failed one had
    been given them (`spare_took`) and does not answer; otherwise (it answers, or the move failed
    before it) None, and the run fails as it would without spares."""
    if not spare_took or spare_answers:
        return None
    return NextMove(plan.spare, f"spare {plan.spare} failed: {error.splitlines()[0]}")
