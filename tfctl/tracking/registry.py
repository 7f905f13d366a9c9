"""The one place that names the tracker kinds: a new tracker is a module and a line here."""

from __future__ import annotations

from tfctl.config.tracking import TrackingSettings
from tfctl.runs.record import TrackerRun
from tfctl.tracking.mlflow import Mlflow
from tfctl.tracking.trackers import Tracker
from tfctl.tracking.wandb import Wandb

KINDS: dict[str, type[Tracker]] = {cls.kind: cls for cls in (Mlflow, Wandb)}


def configured(settings: TrackingSettings | None) -> list[Tracker]:
    """The trackers the cluster file turns on, in a fixed order."""
    if settings is None:
        return []
    return [t for cls in KINDS.values() if (t := cls.of_settings(settings)) is not None]


def of_link(link: TrackerRun) -> Tracker:
    return KINDS[link.kind].of_link(link)


def task_env(links: tuple[TrackerRun, ...]) -> dict[str, str]:
    """Every tracker's variables for the run's tasks (the chief's flag is added per task)."""
    out: dict[str, str] = {}
    for link in links:
        out.update(of_link(link).task_env(link))
    return out
