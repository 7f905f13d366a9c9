"""A run's tracker runs, kept by its controller: made (or taken on) as it starts, told of its end.

At a start (`open_trackers`): a run's first start makes one tracker run per `tracking:` tracker,
nested in its sweep's when it is a trial; `--resume` takes on the earlier run's, and a new
allocation its own, so the tasks log into the same run all its life. At the end
(`close_trackers`): whoever records the end first (its controller, a `down`) logs tfctl's
figures, the output's curves and the report. A tracker that does not answer is said in one
line and kept on the record; the run never waits on it, and never fails by it.
"""

from __future__ import annotations

import bisect
import getpass
import os
from typing import TYPE_CHECKING, Callable, Sequence

from tfctl import console
from tfctl.cluster.cluster import Cluster, Progress
from tfctl.config.model import ClusterConfig
from tfctl.errors import TfctlError, TrackingError
from tfctl.runs import transitions
from tfctl.runs.record import RunRecord, TrackerRun
from tfctl.runs.store import RunStore
from tfctl.runs.sweeps import SweepStore
from tfctl.tracking import registry
from tfctl.tracking.trackers import Ending, Opening, Point, Tracker

if TYPE_CHECKING:
    from tfctl.controller.views.report import RunReport, TaskReport


def say_to_stderr(line: str) -> None:
    """A tracker's trouble on the controller's stderr: an attached `up`'s terminal, a watch.log."""
    console.err().print(line, markup=False)


def _user() -> str:
    """Who runs it; a container's uid without a passwd entry has no name, only its number."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return str(os.getuid())


def _failure(tracker: Tracker, error: Exception) -> str:
    """A tracker's failure in words: its own, or what broke in the exchange (never the run's)."""
    if isinstance(error, TrackingError):
        return error.message
    return f"{tracker.title} failed unexpectedly ({type(error).__name__}: {error})"


def opening_of(record: RunRecord, config: ClusterConfig, parent: TrackerRun | None = None) -> Opening:
    return Opening(
        run_id=record.run_id,
        cluster=record.cluster_name,
        backend=record.backend,
        user=_user(),
        command=config.command or "; ".join(f"{n}: {config.command_for(n)}" for n in config.jobs),
        started_at=record.created_at,
        params=dict(record.params),
        shape={name: len(job.addresses) for name, job in config.jobs.items()},
        parent=parent,
        group=record.sweep or "",
    )


def open_trackers(store: RunStore, cluster: Cluster, config: ClusterConfig, progress: Progress) -> None:
    """The run's tracker runs recorded before its tasks are planned (their variables come from
    the record): taken on from a new allocation's record or the run it resumes, else made."""
    record = cluster.record
    if config.tracking is None:
        return
    earlier = _earlier_links(store, record)
    links = []
    for tracker in registry.configured(config.tracking):
        kept = next((link for link in earlier if link.kind == tracker.kind), None)
        try:
            if kept is not None:
                kept = kept.replace(closed=False, missed=())
                links.append(kept)
                registry.of_link(kept).reopen(kept, record.run_id)  # on the server it was made on
                progress("", f"{tracker.title}: goes on in run {kept.url or kept.run_id}")
            else:
                link = tracker.open(opening_of(record, config, _parent(store, record, tracker)))
                links.append(link)
                progress("", f"{tracker.title}: run {link.url or link.run_id}")
        except Exception as error:  # noqa: BLE001 (a tracker never fails the run)
            left = "its tasks are told the run as before" if kept is not None else "the run goes on without one"
            progress("warning", f"tracking: {_failure(tracker, error)}: {left}")
    linked = cluster.apply(store, transitions.link_trackers(tuple(links)))
    if linked is not None and linked.state.is_final:  # a `down` ended it while the trackers were asked
        close_trackers(store, linked.run_id, lambda line: progress("warning", line))


def _earlier_links(store: RunStore, record: RunRecord) -> tuple[TrackerRun, ...]:
    """A run started again in a new allocation keeps its own; a resumed one takes its earlier run's."""
    if record.tracking:
        return record.tracking
    if record.resumes and store.exists(record.resumes):
        return store.load(record.resumes).tracking
    return ()


def _parent(store: RunStore, record: RunRecord, tracker: Tracker) -> TrackerRun | None:
    """A trial's sweep's run of the same tracker, if the sweep made one."""
    if record.sweep is None:
        return None
    try:
        sweep = SweepStore(store).load(record.sweep)
    except TfctlError:
        return None
    return next((link for link in sweep.tracking if link.kind == tracker.kind), None)


def open_sweep(config: ClusterConfig, sweep_id: str, now: float, say: Callable[[str], None]) -> tuple[TrackerRun, ...]:
    """The runs a new sweep's trials are nested in (W&B: their group), one per tracker."""
    opening = Opening(sweep_id, config.name, config.backend, _user(), config.command or "", now)
    links = []
    for tracker in registry.configured(config.tracking):
        try:
            link = tracker.open_parent(opening)
        except Exception as error:  # noqa: BLE001
            say(f"tracking: {_failure(tracker, error)}: the sweep's trials will be runs of their own")
            continue
        links.append(link)
        if link.url or link.run_id:
            say(f"{tracker.title}: sweep run {link.url or link.run_id}")
    return tuple(links)


def close_sweep(links: tuple[TrackerRun, ...], state: str, at: float, say: Callable[[str], None]) -> None:
    for link in links:
        tracker = registry.of_link(link)
        try:
            tracker.close_parent(link, state, at)
        except Exception as error:  # noqa: BLE001
            say(f"tracking: {_failure(tracker, error)}: its sweep run was not told the sweep ended")


def close_trackers(store: RunStore, run_id: str, say: Callable[[str], None]) -> None:
    """Tell the ended run's tracker runs how it ended, once: of its controller and a `down`, the
    first to get here. What a tracker missed is said and recorded."""
    record = transitions.apply(store, run_id, transitions.close_trackers())
    if record is None:
        return
    ending = ending_of(store, record)
    missed: dict[str, tuple[str, ...]] = {}
    for link in record.tracking:
        tracker = registry.of_link(link)
        try:
            lost = tracker.close(link, ending)
        except Exception as error:  # noqa: BLE001 (a tracker never fails the run)
            lost = [f"the run's end, tfctl's figures and the report ({_failure(tracker, error)})"]
        if lost:
            missed[link.kind] = tuple(lost)
            say(f"tracking: {tracker.title} run {link.url or link.run_id} was not given {'; '.join(lost)}")
    if missed:
        transitions.apply(store, run_id, transitions.tracking_missed(missed))


def ending_of(store: RunStore, record: RunRecord) -> Ending:
    """How the run ended, what it cost, the chief's curves and the report (from its hosts, if
    they answer: else without them)."""
    from tfctl.controller.views.report import render
    from tfctl.controller.views.report_gather import gather

    total = (record.accounting or {}).get("total") or {}
    figures = {k: float(total[k]) for k in ("wall_seconds", "cpu_hours", "gpu_hours") if total.get(k) is not None}
    report: RunReport | None
    try:
        with Cluster(record) as cluster:
            report = gather(cluster)
    except Exception:  # noqa: BLE001 (no report is a line of `missed`, never the run's failure)
        report = None
    series: dict[str, tuple[Point, ...]] = {}
    result: dict[str, Point] = {}
    if report is not None:
        chief = _chief(report.tasks, record)
        if chief is not None:
            series = curves(chief)
        at = record.ended_at or report.generated_at
        result = {n: Point(m.step or 0, m.value, at) for n, m in report.result.items()}
    return Ending(
        run_id=record.run_id,
        state=record.state.value,
        reason=record.reason or "",
        ended_at=record.ended_at or 0.0,
        folder=str(store.run_dir(record.run_id)),
        figures=figures,
        series=series,
        result=result,
        report=None if report is None else render(report),
    )


def _chief(tasks: Sequence[TaskReport], record: RunRecord) -> TaskReport | None:
    named = {t.name: t for t in tasks}
    for name in (*record.decisive, "chief:0", "worker:0"):
        if name in named:
            return named[name]
    return tasks[0] if tasks else None


def curves(task: TaskReport) -> dict[str, tuple[Point, ...]]:
    """The task's steps/s and its model's curves (loss, accuracy...), each point at the step
    the task had logged by then."""
    times = [at for at, _ in task.steps]

    def step_at(at: float) -> int:
        index = bisect.bisect_right(times, at) - 1
        return int(task.steps[index][1]) if index >= 0 else 0

    out = {"steps_per_sec": tuple(Point(step_at(at), rate, at) for at, rate in task.rates)}
    logged = dict(task.metric_steps)
    for name, points in task.metrics:
        steps = logged.get(name) or (None,) * len(points)
        out[name] = tuple(Point(step_at(at) if s is None else s, v, at) for (at, v), s in zip(points, steps))
    return {name: points for name, points in out.items() if points}
