"""`Run`: a handle on one run, by id and tfctl home. It holds no connection and no lock, so it is
safe to share between threads and to pickle into a worker process; every call reads the run's
record and asks its controller (or its hosts) afresh."""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from tfctl.api.reading import select_tasks
from tfctl.api.types import Ended, LogLine, Metrics, RunStatus, RunSummary, Stopped, TaskMetrics, metrics_of
from tfctl.engine.clock import REAL_CLOCK, Cancel
from tfctl.errors import TfctlError
from tfctl.runs.record import RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.states import RunState, TaskState

if TYPE_CHECKING:
    from tfctl.controller.views.report import RunReport

WAIT_POLL = 0.5  # seconds between two reads of the record by `Run.wait`


class Timeout(TfctlError):
    """`Run.wait(timeout=...)` ran out of time; the run goes on."""


@dataclass(frozen=True)
class Run:
    """A run tfctl started: `tfctl.up(...)` returns one, `tfctl.run(id)` finds one."""

    id: str
    home: Path  # the tfctl home its record is in ($TFCTL_HOME when it was found)

    def status(self) -> RunStatus:
        """What `tfctl status --json` says of it: every task's state, progress and diagnosis,
        asked of its live controller, else of its hosts."""
        from tfctl.api.reading import status_asker

        store = RunStore(self.home)
        record = _resumed(store, store.load(self.id))
        with status_asker(store, record) as ask:
            shot, latest = ask(0)
        return RunStatus.from_json(shot.to_json(latest))

    def wait(self, timeout: float | None = None) -> Ended:
        """Until the run has ended; how it ended. A run whose controller died meanwhile gets a new
        one (as `status` gives it), so a wait never outlives what could end the run. Raises
        `Timeout` after `timeout` seconds, the run going on."""
        store, clock = RunStore(self.home), REAL_CLOCK  # (the run's processes live on real time)
        record = store.load(self.id)
        began = clock.monotonic()
        never = Cancel()
        while record.active:
            _resumed(store, record)
            if timeout is not None and clock.monotonic() - began >= timeout:
                raise Timeout(
                    f"run {record.run_id} is still {record.state} after {timeout:g}s", hint="wait again, or down()"
                )
            clock.wait(never, WAIT_POLL)
            record = store.load(self.id)
        ended = ended_of(record)
        return ended if record.state is not RunState.FAILED else self._why_failed(ended)

    def _why_failed(self, ended: Ended) -> Ended:
        """The failed run's culprit (the task its reason names, else the first that failed) and
        what `status` diagnoses of it; as it was, if its hosts cannot say."""
        try:
            tasks = self.status().tasks
        except TfctlError:
            return ended
        named = [t for t in tasks if t.name in (ended.reason or "")]
        failed = named or [t for t in tasks if t.state is TaskState.FAILED]
        if not failed:
            return ended
        return dataclasses.replace(ended, task=failed[0].name, diagnosis=failed[0].diagnosis)

    def logs(
        self,
        *,
        follow: bool = False,
        tasks: Sequence[str] = (),
        since: float | None = None,
        tail: int | None = None,
    ) -> Iterator[LogLine]:
        """Every line the run's tasks printed (`tasks`: `job` or `job:index` names; all if empty),
        in the order `logs` prints them; `follow` goes on until the run ends. `since`: seconds
        back from now; `tail`: the last lines of each task. A reader's error raises `TfctlError`
        at the end, after every line it could read."""
        from tfctl.api.reading import logs_parts
        from tfctl.controller.live.rpc_messages import LogsAsk

        store = RunStore(self.home)
        record = _resumed(store, store.load(self.id))
        ask = LogsAsk(
            tasks=[t.name for t in select_tasks(record, tasks)], follow=follow, tail=tail, since=since, lines=True
        )
        while True:
            errors: list[str] = []
            parts = logs_parts(store, record, ask)
            try:
                for part in parts:
                    for task, line in part.lines:
                        yield LogLine(task, line)
                    errors += part.errors
            finally:
                parts.close()
            if errors:
                raise TfctlError(f"reading the logs of run {record.run_id}: {'; '.join(errors)}")
            if not follow:
                return
            from tfctl.controller.live.resubmit import next_allocation

            goes_on = next_allocation(store, record)  # a resubmitted run's tasks start again in its next allocation
            if goes_on is None:
                return
            record, ask = goes_on, ask.replace(tail=None, since=None)

    def metrics(self) -> Metrics:
        """What the report reads from the tasks' output: each task's steps and its loss,
        accuracy, ... series, and the run's final evaluation."""
        report = gathered(RunStore(self.home).load(self.id))
        return Metrics(
            tasks=tuple(TaskMetrics(t.name, t.steps, dict(t.metrics)) for t in report.tasks),
            result=metrics_of({name: m.to_json() for name, m in report.result.items()}),
        )

    def down(self, grace: float | None = None) -> Stopped:
        """Stop every task of the run (SIGTERM, then SIGKILL after `grace` seconds: the cluster
        file's grace_period unless given) and release what its backend holds; what was stopped."""
        from tfctl.controller.verbs import down

        store = RunStore(self.home)
        report, released = down.down(store, store.load(self.id), grace)
        return Stopped(
            processes=report.processes,
            hosts=report.hosts,
            ended=report.ended,
            remaining={h: tuple(p) for h, p in report.remaining.items()},
            unreachable=dict(report.unreachable),
            containers_left={h: tuple(c) for h, c in report.containers_left.items()},
            released=None if released is None else released.line(),
        )

    def report(self, path: str | os.PathLike[str]) -> Path:
        """Write the run's report (one HTML page that works offline) to `path`; the path."""
        return write_page(Path(path), report_page(RunStore(self.home).load(self.id)))


def write_page(target: Path, page: str) -> Path:
    """A report's page written to `target`; a file that cannot be written is a `TfctlError`."""
    try:
        target.write_text(page, encoding="utf-8")
    except OSError as e:
        raise TfctlError(
            f"cannot write the report to {target}: {e.strerror}", hint="name another file (`report -o FILE`)"
        ) from None
    return target


def report_page(record: RunRecord) -> str:
    """The run's report, asked of its hosts: its facts, a timeline of every task, steps/s over
    time, the model's curves and the diagnosis, as one HTML page that fetches nothing."""
    from tfctl.controller.views.report import render

    return render(gathered(record))


def gathered(record: RunRecord) -> RunReport:
    """What the report shows of the run, asked of its hosts (`metrics()` reads the same)."""
    from tfctl.cluster.cluster import Cluster
    from tfctl.controller.views.report_gather import gather

    with Cluster(record) as cluster:
        return gather(cluster)


def run(run_id: str, *, home: str | os.PathLike[str] | None = None) -> Run:
    """The run with this id (as `tfctl runs` lists them); `UsageError` if tfctl keeps none."""
    store = RunStore(None if home is None else Path(home))
    store.load(run_id)  # raises for an unknown id, with the hint
    return Run(run_id, store.home)


def list_runs(
    cluster: str | os.PathLike[str] | None = None, *, home: str | os.PathLike[str] | None = None
) -> list[RunSummary]:
    """The runs of a cluster file (every run tfctl keeps, when None), oldest first, as `tfctl
    runs --json` lists them."""
    records = RunStore(None if home is None else Path(home)).all()
    if cluster is not None:
        wanted = str(Path(cluster).resolve())
        records = [r for r in records if r.cluster_file == wanted]
    return [summary_of(r) for r in records]


def summary_of(r: RunRecord) -> RunSummary:
    return RunSummary(
        r.run_id, r.cluster_name, r.cluster_file, r.state, r.created_at, r.ended_at, r.reason, r.resumes,
        metrics_of(r.result),
    )  # fmt: skip


def ended_of(r: RunRecord) -> Ended:
    return Ended(r.run_id, r.state, r.reason, r.ended_at, metrics_of(r.result))


_resume_lock = threading.Lock()  # two threads of one process that find the controller gone start one watcher


def _resumed(store: RunStore, record: RunRecord) -> RunRecord:
    """The record, with a new watcher started first when the run is live but its controller died
    (as the CLI's verbs do); the record as it is then."""
    from tfctl.controller.live import driver

    with _resume_lock:
        if driver.resume(store, record):
            return store.load(record.run_id)
    return record
