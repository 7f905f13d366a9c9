"""How a run ends: its outcome from its tasks' states (`decide`); what states cannot see (a hang,
a stall, the backend's own end) is weighed in `engine.reconcile`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tfctl.engine.observed import TaskStatus
from tfctl.supervisor.protocol import RunState, TaskState


@dataclass(frozen=True)
class Outcome:
    """How a run ended (or must end): the run state to record, why, and the task to blame.
    `silent`: hosts judged lost, which the final stop asks but does not wait for."""

    state: RunState
    reason: str
    culprit: str | None = None
    silent: tuple[str, ...] = ()

    @property
    def succeeded(self) -> bool:
        return self.state is RunState.SUCCEEDED


# How a run stopped by a `down` ends, whoever carries the `down` out.
STOPPED_BY_DOWN = Outcome(RunState.STOPPED, "tfctl down")


def decide(statuses: Sequence[TaskStatus], decisive: Sequence[str], essential: Sequence[str]) -> Outcome | None:
    """The run's outcome from its tasks' states, or None while it is still undecided."""
    by_name = {s.task: s for s in statuses}
    for s in statuses:
        if s.state.is_bad:
            return Outcome(RunState.FAILED, f"{s.task} on {s.host} {s.describe_end()}", s.task)
    if decisive and all(d in by_name and by_name[d].state is TaskState.SUCCEEDED for d in decisive):
        # Before stopped tasks: a ps its host stopped once the job was over does not undo it.
        return Outcome(RunState.SUCCEEDED, f"{', '.join(decisive)} finished successfully")
    for s in statuses:
        if s.state is TaskState.STOPPED:
            return Outcome(RunState.STOPPED, f"{s.task} on {s.host} {s.describe_end()}", s.task)
    for name in essential:
        ended = by_name.get(name)
        if ended is not None and ended.final:
            return Outcome(
                RunState.FAILED,
                f"{ended.task} on {ended.host} ended while the job was running ({ended.describe_end()})",
                ended.task,
            )
    return None
