"""What a refused reachability probe means, decided from the targets' states.

A task can listen, be seen listening, and be gone when the other hosts probe it (a quick task,
a resumed run with nothing left to do); its process gone, the connection is refused a moment
before its monitor records its end. So a refusal is judged by the targets' ends first, and is a
network fault only once none of them ended within the settle time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tfctl.engine.observed import TaskStatus
from tfctl.supervisor.protocol import TaskState


@dataclass(frozen=True)
class AfterRefusal:
    """`failed`: a target ended badly, which fails the start as itself; `finished`: targets done
    (exit 0), probed no more; `network_fault`: none ended in time; none of these: look again."""

    failed: TaskStatus | None = None
    finished: tuple[str, ...] = ()
    network_fault: bool = False

    @property
    def look_again(self) -> bool:
        return self.failed is None and not self.finished and not self.network_fault


def after_refusal(statuses: Sequence[TaskStatus], waited: float, settle: float) -> AfterRefusal:
    """The meaning of a refused probe, from the probed tasks' states `waited` seconds after it."""
    ended = [s for s in statuses if s.final]
    failed = next((s for s in ended if s.state is not TaskState.SUCCEEDED), None)
    if failed is not None:
        return AfterRefusal(failed=failed)
    if ended:
        return AfterRefusal(finished=tuple(s.task for s in ended))
    return AfterRefusal(network_fault=waited > settle)
