"""Stopping a run's tasks on every host, proving it, and giving back what its backend holds:
for `tfctl down` (`verbs/down.py`) when no controller lives, and for the live controller at the
run's end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Collection

from tfctl.backends.base import backend_for
from tfctl.cluster.answers import StopReport
from tfctl.cluster.cluster import Cluster
from tfctl.errors import TfctlError
from tfctl.runs import transitions
from tfctl.runs.accounting import cost_json
from tfctl.runs.record import RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import TaskState
from tfctl.tf.progress import RunProgress
from tfctl.tf.results import result_json

if TYPE_CHECKING:
    from tfctl.backends.base import BackendReport


def release(record: RunRecord) -> BackendReport | None:
    """Give back what the run's backend acquired for it (a scheduler's allocation), if anything;
    what the backend says of it once given back."""
    return backend_for(record.backend).release(record)


def stop_run(
    store: RunStore, cluster: Cluster, grace: float | None = None, silent: Collection[str] = ()
) -> tuple[StopReport, BackendReport | None]:
    """Stop every task of the run, then release what its backend holds. The record keeps whether
    the stop proved nothing left, so the next `up` need not ask the hosts again. `silent`: hosts
    judged lost, not waited for."""
    report = cluster.stop(grace, silent)
    still_lost = tuple(h for h in cluster.record.lost_hosts if h.name in report.lost_silent)
    # A lost host still silent may come back with what it ran: the next `up` must ask the hosts.
    left_nothing = report.clean and not report.lost_silent
    cost, result = final_figures(cluster, {*report.unreachable, *report.lost_silent})  # before the backend lets go
    cluster.apply(store, transitions.record_stop(left_nothing, still_lost, cost, result))
    released = release(cluster.record)
    if released is not None and "accounting" in released.fields:  # the scheduler's own figures, beside tfctl's
        figures = {**(cost or {}), cluster.record.backend: released.fields["accounting"]}
        cluster.apply(store, transitions.record_accounting(figures))
    return report, released


def final_figures(cluster: Cluster, silent: set[str]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """What the stopped run cost and its result (`tf.results`), asked of the hosts that just
    answered the stop (a silent one is not waited for again); None when none of them could say."""
    record = cluster.record
    tasks = [t for t in record.tasks if t.host not in silent]
    if not tasks:
        return None, None
    progress = RunProgress(record.progress)
    try:
        statuses, _ = cluster.status(tasks, progress=progress.rule())
    except TfctlError:
        return None, None
    now = backend_for(record.backend).clock.time()
    cost = cost_json([s.cost(now) for s in statuses if s.state is not TaskState.UNREACHABLE], now - record.created_at)
    return cost, result_json(progress.results.read(statuses))
