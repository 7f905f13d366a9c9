"""The states of a task and of a run, which know which of them are final.

Stdlib only: the host supervisor and the controller share them (`protocol`)."""

from __future__ import annotations

import enum


class TaskState(str, enum.Enum):
    """One task's state. `unreachable` is the controller's: the task's host did not answer."""

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"  # it ended, and its restart policy starts it again after a backoff
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"
    UNREACHABLE = "unreachable"

    def __str__(self) -> str:
        return self.value

    @property
    def is_final(self) -> bool:
        """The task will never run again: its process is gone and how it ended is known."""
        return self in _FINAL_TASK_STATES

    @property
    def is_bad(self) -> bool:
        """A state that ends a job by itself (the task failed, or nobody knows how it ended)."""
        return self in (TaskState.FAILED, TaskState.LOST)

    @property
    def may_be_alive(self) -> bool:
        """A process of the task may exist (or its host could not tell)."""
        return self in (TaskState.STARTING, TaskState.RUNNING, TaskState.RESTARTING, TaskState.UNREACHABLE)


_FINAL_TASK_STATES = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.LOST})


class RunState(str, enum.Enum):
    """A whole run's state, as the run store records it."""

    QUEUED = "queued"  # submitted, waiting for its pool to have room: nothing of it on any host yet
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value

    @property
    def is_final(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED)

    @property
    def is_bad(self) -> bool:
        return self is RunState.FAILED
