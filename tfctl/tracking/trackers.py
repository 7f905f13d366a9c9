"""`Tracker`: what every experiment tracker does for a run (`registry.py` names them).

A tracker is opened from the cluster file's settings (`Tracker.of_settings`) and, afterwards,
known only by the link the run's record keeps (`Tracker.of_link`): a new allocation hours later,
or a `--resume` after the file changed, logs into the run the record names.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from tfctl.config.tracking import TrackingSettings
from tfctl.runs.record import TrackerRun


@dataclass(frozen=True)
class Opening:
    """What a tracker's run is made with, at a run's first start."""

    run_id: str
    cluster: str
    backend: str
    user: str
    command: str
    started_at: float
    params: Mapping[str, Any] = field(default_factory=dict)
    shape: Mapping[str, int] = field(default_factory=dict)  # job -> its tasks
    parent: TrackerRun | None = None  # the sweep's run, of the same tracker
    group: str = ""  # the sweep, else "" (the run stands alone)


@dataclass(frozen=True)
class Point:
    step: int
    value: float
    at: float  # epoch seconds


@dataclass(frozen=True)
class Ending:
    """What tfctl tells a tracker at a run's end: how it ended, its cost, what it read from the
    output, and the report page."""

    run_id: str
    state: str  # RunState's value
    reason: str
    ended_at: float
    folder: str  # the run's directory in the run store (where a tracker's own files may go)
    figures: Mapping[str, float] = field(default_factory=dict)  # wall_seconds, cpu_hours, gpu_hours
    series: Mapping[str, tuple[Point, ...]] = field(default_factory=dict)  # steps_per_sec, loss, accuracy...
    result: Mapping[str, Point] = field(default_factory=dict)  # the final evaluation's numbers
    report: str | None = None  # the HTML report; None: it could not be made


class Tracker(abc.ABC):
    """One tracker kind. Methods raise `TrackingError`; none is the run's failure."""

    kind: ClassVar[str]
    title: ClassVar[str]  # as a person names it: "MLflow"

    @classmethod
    @abc.abstractmethod
    def of_settings(cls, settings: TrackingSettings) -> Tracker | None:
        """The tracker the cluster file's `tracking:` turns on, None if it names none of this kind."""

    @classmethod
    @abc.abstractmethod
    def of_link(cls, link: TrackerRun) -> Tracker:
        """The tracker a run's record names."""

    @abc.abstractmethod
    def open(self, opening: Opening) -> TrackerRun:
        """Make the tracker's run for a tfctl run's first start."""

    @abc.abstractmethod
    def open_parent(self, opening: Opening) -> TrackerRun:
        """Make the run a sweep's trials are nested in."""

    @abc.abstractmethod
    def reopen(self, link: TrackerRun, run_id: str) -> None:
        """The run goes on as tfctl run `run_id` (`--resume`, a new allocation): running again."""

    @abc.abstractmethod
    def close(self, link: TrackerRun, ending: Ending) -> list[str]:
        """Log the end; what could not be logged, in words (empty: everything was)."""

    @abc.abstractmethod
    def close_parent(self, link: TrackerRun, state: str, at: float) -> None:
        """The sweep ended."""

    @abc.abstractmethod
    def task_env(self, link: TrackerRun) -> dict[str, str]:
        """The variables every task reads its tracker run from."""
