"""What a run cost, the same for every backend: per task its wall time (every run of it),
CPU-hours (its process trees' CPU time, as its host's monitor counted it) and GPU-hours (the
GPUs it was placed on, held for its wall time); then the run's totals.

Pure: the caller gathers the numbers (`status` from the hosts, the controller at the run's end,
which keeps them on the run's record for `runs --json`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

HOUR = 3600.0


@dataclass(frozen=True)
class TaskCost:
    task: str
    wall_seconds: float  # every run of it, start to end (or to now)
    cpu_seconds: float | None  # None: its host never measured it (an older supervisor)
    gpus: int  # placed on

    @property
    def cpu_hours(self) -> float | None:
        return None if self.cpu_seconds is None else self.cpu_seconds / HOUR

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.wall_seconds / HOUR


def wall_seconds(runs: Iterable[tuple[float, float | None]], now: float) -> float:
    """Seconds over the task's runs, (start, end) each; one not ended runs until `now`."""
    return sum(max((end if end is not None else now) - start, 0.0) for start, end in runs)


def cost_json(costs: Sequence[TaskCost], run_wall_seconds: float) -> dict[str, Any]:
    """`{"tasks": {name: {...}}, "total": {...}}`, hours rounded; the total names the tasks
    whose CPU time no host measured (`unmeasured`), so its sum never leaves one out unsaid."""
    measured = [c.cpu_seconds for c in costs if c.cpu_seconds is not None]
    total = _entry(run_wall_seconds, sum(measured) / HOUR if measured else None, sum(c.gpu_hours for c in costs))
    return {
        "tasks": {c.task: _entry(c.wall_seconds, c.cpu_hours, c.gpu_hours) for c in costs},
        "total": {**total, "unmeasured": [c.task for c in costs if c.cpu_seconds is None]},
    }


def _entry(wall: float, cpu_hours: float | None, gpu_hours: float) -> dict[str, Any]:
    return {
        "wall_seconds": round(wall, 1),
        "cpu_hours": None if cpu_hours is None else round(cpu_hours, 4),
        "gpu_hours": round(gpu_hours, 4),
    }


def hours_text(hours: float | None) -> str:
    """`44 s`, `12.5 min`, `3.20 h`: a short run reads in seconds, a long one in hours."""
    if hours is None:
        return "-"
    seconds = hours * HOUR
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < HOUR:
        return f"{seconds / 60:.1f} min"
    return f"{hours:.2f} h"


def unsettled(figures: object) -> bool:
    """Scheduler figures that may still change (asked while a job ran, or before the scheduler
    recorded it): their readers ask the scheduler again. Figures that do not say are settled."""
    return isinstance(figures, Mapping) and figures.get("settled") is False


def scheduler_text(figures: Mapping[str, Any]) -> str:
    """A scheduler's own figures in a line: `job 5 COMPLETED: 1.2 min, CPU 2 s, GPU -`; or that its
    accounting is off, and why. The shape: `enabled`, then `why`, or `allocations` (each `id`,
    `state`, `elapsed_seconds`, `cpu_hours`, `gpu_hours`), `missing` ids and `settled`."""
    if not figures.get("enabled"):
        return f"off ({figures.get('why', 'not kept')}): tfctl's figures only"
    parts = [
        f"job {a['id']} {a['state']}: {hours_text(a['elapsed_seconds'] / HOUR)}, "
        f"CPU {hours_text(a['cpu_hours'])}, GPU {hours_text(a['gpu_hours']) if a['gpu_hours'] else '-'}"
        for a in figures.get("allocations", [])
    ]
    missing = figures.get("missing") or []
    parts += [f"job {job}: not recorded yet" for job in missing]
    return "; ".join(parts) or "nothing recorded yet"
