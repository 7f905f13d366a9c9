"""What can happen to a run that its `notify:` commands hear of: the engine decides when, the
live controller delivers (`controller/live/notify.py`)."""

from __future__ import annotations

import enum

from tfctl.supervisor.protocol import RunState


class EventKind(str, enum.Enum):
    """What happened to the run."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    STALLED = "stalled"  # a task made no step for `progress.stall_timeout` (`on_stall: warn`)
    RESTARTED = "restarted"  # a task's restart policy started it again
    MOVED = "moved"  # a lost host's task started on a spare (`controller/live/spares.py`)
    RESUBMITTED = "resubmitted"  # the allocation ended under the run (time limit, preemption): it goes on in a new one

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of_end(cls, state: RunState) -> EventKind:
        """The event of a run that ended in `state` (a final state)."""
        return cls(state.value)
