"""One task's status as the controller reports it: its spec, what its host answered, and how it
ended in words (`describe_end`), whoever reads it: `status`, `up`, the doctor, the report."""

from __future__ import annotations

import signal as signal_module
import time
from dataclasses import dataclass
from typing import Any

from tfctl.runs.accounting import TaskCost, wall_seconds
from tfctl.runs.record import TaskSpec
from tfctl.supervisor.protocol import Attempt, Mark, TaskInfo, TaskState, Usage


def describe_end(
    state: TaskState,
    exit_code: int | None = None,
    signal: int | None = None,
    error: str | None = None,
    ended_at: float | None = None,
    stop_reason: str | None = None,
    stopped_by: str = "tfctl down",
) -> str:
    """How a finished task ended, as the rest of a sentence that starts with the task's name.

    E.g. `was killed by signal 9 (SIGKILL, maybe by the kernel's out-of-memory killer) at 18:44:03`.
    The one wording for run outcomes, start failures and diagnoses; `ended_at` (epoch) adds the time.
    `stopped_by`: why tfctl stopped it, where the run's end is known (its success policy, ...).
    """
    at = f" at {time.strftime('%H:%M:%S', time.localtime(ended_at))}" if ended_at is not None else ""
    if state is TaskState.LOST:
        return f"was lost: {error}" if error else "was lost (its process is gone and no exit code was recorded)"
    if state is TaskState.STOPPED:
        return f"was stopped by its host{at}: {stop_reason}" if stop_reason else f"was stopped ({stopped_by}){at}"
    if signal:
        why = ", maybe by the kernel's out-of-memory killer" if signal == 9 else ""
        return f"was killed by signal {signal} ({signal_name(signal)}{why}){at}"
    if error:
        return f"{error}{at}"
    return f"exited with code {exit_code}{at}"


def signal_name(number: int) -> str:
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class TaskStatus:
    """What is true about one task right now, as its host's supervisor sees it."""

    task: str
    job: str
    index: int
    host: str
    port: int
    state: TaskState
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    listening: bool = False
    uptime: float | None = None
    last_line: str = ""
    error: str | None = None
    ended_at: float | None = None
    stop_reason: str | None = None
    restarts: int = 0
    earlier_ends: tuple[str, ...] = ()
    unreachable_since: float | None = None  # epoch, as the run's controller last recorded it
    marks: tuple[Mark, ...] = ()  # recent progress lines, when asked for
    observed_at: float | None = None  # the host's clock when it answered (marks use that clock)
    gpus: tuple[int, ...] | None = None  # as placed (`TaskSpec.gpus`)
    cpus: tuple[int, ...] | None = None
    tail: tuple[str, ...] | None = None  # its last output lines, when asked for with its status
    started_at: float | None = None  # of its current (or last) run, by its host's clock
    attempts: tuple[Attempt, ...] = ()  # its earlier runs, when it was restarted
    host_problem: str | None = None  # why its host's state directory refuses writes (a full disk)
    unrecorded: bool = False  # its end is known on its host but not yet written there
    usage: Usage | None = None  # what its process tree uses, while it runs
    usage_history: tuple[Usage, ...] = ()  # earlier samples, when asked for
    cpu_seconds: float | None = None  # of every run of it so far, as its host's monitor counted
    output_at: float | None = None  # when it last printed, by its host's clock
    output_lines: int | None = None  # lines it printed so far, when asked for

    @classmethod
    def of(
        cls,
        spec: TaskSpec,
        info: TaskInfo | None,
        unreachable_since: float | None = None,
        observed_at: float | None = None,
        tail: list[str] | None = None,
        host_problem: str | None = None,
    ) -> TaskStatus:
        """A task's status from its host's answer; `unreachable` when the host did not answer."""
        if info is None:
            return cls(
                spec.name,
                spec.job,
                spec.index,
                spec.host,
                spec.port,
                TaskState.UNREACHABLE,
                unreachable_since=unreachable_since,
                gpus=spec.gpus,
                cpus=spec.cpus,
            )
        return cls(
            spec.name,
            spec.job,
            spec.index,
            spec.host,
            spec.port,
            info.state,
            info.pid,
            info.exit_code,
            info.signal,
            info.listening,
            info.uptime,
            info.last_line,
            info.error,
            info.ended_at,
            info.stop_reason,
            info.restarts,
            tuple(info.earlier_ends),
            marks=tuple(info.marks),
            observed_at=observed_at,
            gpus=spec.gpus,
            cpus=spec.cpus,
            tail=None if tail is None else tuple(tail),
            started_at=info.started_at,
            attempts=tuple(info.attempts),
            host_problem=host_problem or None,
            unrecorded=info.unrecorded,
            usage=info.usage,
            usage_history=tuple(info.usage_history),
            cpu_seconds=info.cpu_seconds,
            output_at=info.output_at,
            output_lines=info.output_lines,
        )

    def cost(self, now: float) -> TaskCost:
        """What it used so far: every run of it (`attempts`, then the current or last one)."""
        runs: list[tuple[float, float | None]] = [(a.started_at, a.ended_at) for a in self.attempts]
        if self.started_at is not None:
            runs.append((self.started_at, self.ended_at if self.final else None))
        return TaskCost(self.task, wall_seconds(runs, now), self.cpu_seconds, len(self.gpus or ()))

    @property
    def final(self) -> bool:
        return self.state.is_final

    def describe_end(self) -> str:
        end = describe_end(self.state, self.exit_code, self.signal, self.error, stop_reason=self.stop_reason)
        if self.restarts:
            times = f"{self.restarts} restart{'s' if self.restarts != 1 else ''}"
            end += f" (after {times}; before: {', '.join(self.earlier_ends)})"
        return end

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "job": self.job,
            "index": self.index,
            "host": self.host,
            "port": self.port,
            "state": self.state.value,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "listening": self.listening,
            "uptime": self.uptime,
            "last_line": self.last_line,
            "stop_reason": self.stop_reason,
            "restarts": self.restarts,
            "unreachable_since": self.unreachable_since,
            "host_problem": self.host_problem,
            "unrecorded": self.unrecorded,
            "gpus": None if self.gpus is None else list(self.gpus),
            "cpus": None if self.cpus is None else list(self.cpus),
            "cpu_percent": None if self.usage is None else self.usage.cpu_percent,
            "rss_bytes": None if self.usage is None else self.usage.rss_bytes,
            "gpu_util_percent": None if self.usage is None else self.usage.gpu_util_percent,
            "gpu_memory_bytes": None if self.usage is None else self.usage.gpu_memory_bytes,
        }
