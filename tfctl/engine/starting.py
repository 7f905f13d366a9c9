"""A start phase's answers, decided one at a time on the time passed in: what the hosts said of
the tasks they were asked to start (`began`: running, done already, or the start fails), then
waiting for them to listen.

The driver (`cluster.control.wait_listening`) asks the hosts how the tasks are, letting each host
wait up to `ListenWait.patience` seconds for its ports itself, and hands the answer to `heard`,
which says what it means: who listens now, a task that ended before it listened (the start
fails), the deadline passed (the start fails, or goes on without them where the wait is only a
hint), or how long to pause before asking again. No I/O and no clock of its own, so every case
is a row of a table (`tests/test_engine_starting.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from tfctl.engine.observed import TaskStatus
from tfctl.runs.record import TaskSpec
from tfctl.supervisor.protocol import TaskInfo, TaskState

# Each host waits on its own ports for at most LISTEN_WAIT seconds per request, so Ctrl-C and a
# lost host are noticed within that. A host that answers sooner without its ports listening (it
# could not be asked) is asked again after a pause: LISTEN_POLL at first, then a tenth of the
# time waited so far, at most LISTEN_POLL_MAX.
LISTEN_WAIT = 1.0
LISTEN_POLL = 0.05
LISTEN_POLL_MAX = 0.5


@dataclass(frozen=True)
class Began:
    """What the hosts' answer to a start means: a line per task, in order, and the task whose end
    fails the start with the words for it (its name first), if one ended at once other than with exit 0."""

    said: tuple[tuple[str, str], ...] = ()
    failed: tuple[str, str] | None = None


def began(answers: Sequence[tuple[TaskSpec, TaskInfo]]) -> Began:
    """The answers, by task name: a quick task may be done before its start is answered (exit 0:
    fine); one that ended otherwise fails the start."""
    said = []
    for spec, info in sorted(answers, key=lambda answer: answer[0].name):
        if info.state is TaskState.SUCCEEDED:
            said.append((spec.name, "finished already (exit code 0)"))
        elif info.state.is_final:
            when = "" if info.error else ", right after it started"  # an error says that itself
            why = f"{spec.name} {TaskStatus.of(spec, info).describe_end()}{when}"
            return Began(tuple(said), (spec.name, why))
        else:
            said.append((spec.name, f"running (pid {info.pid})"))
    return Began(tuple(said))


@dataclass(frozen=True)
class Heard:
    """What one answer means for the wait."""

    listened: tuple[tuple[str, float], ...] = ()  # (task, seconds since the wait began), in order
    failed: TaskStatus | None = None  # ended before it listened: the start fails
    late: tuple[str, ...] = ()  # not listening by the deadline
    go_on: bool = False  # with `late`: the wait was a hint, the start goes on without them
    done: bool = False  # nobody left to wait for
    pause: float = 0.0  # before asking again


class ListenWait:
    """The tasks of one phase, waited for until they listen or `timeout` seconds pass.
    `required`: not listening by then fails the start; else the start goes on (an order hint)."""

    def __init__(self, names: Iterable[str], timeout: float, required: bool, began: float) -> None:
        self.waiting = set(names)
        self.listening: list[str] = []
        self.timeout, self.required = timeout, required
        self.began, self.deadline = began, began + timeout

    def patience(self, now: float) -> float:
        """How long the hosts may wait for the ports themselves, asked at `now`."""
        return max(0.0, min(LISTEN_WAIT, self.deadline - now))

    def heard(self, statuses: Sequence[TaskStatus], asked: float, now: float) -> Heard:
        """The answer to the ask made at `asked`, read at `now`. A task done with exit 0 needs no
        waiting for; one that ended otherwise fails the start."""
        listened = []
        for s in statuses:
            if s.task not in self.waiting:
                continue
            if s.listening:
                self.waiting.discard(s.task)
                self.listening.append(s.task)
                listened.append((s.task, now - self.began))
            elif s.state is TaskState.SUCCEEDED:
                self.waiting.discard(s.task)  # done before it was needed
            elif s.final:
                return Heard(tuple(listened), failed=s)
        if not self.waiting:
            return Heard(tuple(listened), done=True)
        if now > self.deadline:
            return Heard(tuple(listened), late=tuple(sorted(self.waiting)), go_on=not self.required)
        answered_early = now - asked < self.patience(asked)
        pause = min(LISTEN_POLL_MAX, max(LISTEN_POLL, (now - self.began) / 10)) if answered_early else 0.0
        return Heard(tuple(listened), pause=pause)
