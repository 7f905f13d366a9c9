"""`tfctl down` and `down --all`: stop a run's tasks (through its live controller when there is
one), release what the backend holds for it, and stop orphans that no live run owns.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Collection

from tfctl.backends.base import backend_for
from tfctl.cluster.agent import open_agent
from tfctl.cluster.answers import StopReport
from tfctl.cluster.cluster import Cluster
from tfctl.cluster.group import fan_out
from tfctl.controller.live.watcher import controller_elsewhere, stop_watcher, wait_gone
from tfctl.errors import TfctlError
from tfctl.runs import transitions
from tfctl.runs.accounting import cost_json
from tfctl.runs.record import HostSpec, RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState, SweepAnswer, SweepRequest, TaskState

if TYPE_CHECKING:
    from tfctl.backends.base import BackendReport

LOG_DRAIN_SECONDS = 10.0


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
    cost = final_cost(cluster, {*report.unreachable, *report.lost_silent})  # before the backend lets go
    cluster.apply(store, transitions.record_stop(left_nothing, still_lost, cost))
    released = release(cluster.record)
    if released is not None and "accounting" in released.fields:  # the scheduler's own figures, beside tfctl's
        figures = {**(cost or {}), cluster.record.backend: released.fields["accounting"]}
        cluster.apply(store, transitions.record_accounting(figures))
    return report, released


def final_cost(cluster: Cluster, silent: set[str]) -> dict[str, Any] | None:
    """What the stopped run cost, asked of the hosts that just answered the stop (a silent one
    is not waited for again); None when none of them could say."""
    record = cluster.record
    tasks = [t for t in record.tasks if t.host not in silent]
    if not tasks:
        return None
    try:
        statuses, _ = cluster.status(tasks)
    except TfctlError:
        return None
    now = time.time()
    return cost_json([s.cost(now) for s in statuses if s.state is not TaskState.UNREACHABLE], now - record.created_at)


def _down_patience(record: RunRecord, grace: float | None) -> float:
    """How long a live controller may take to stop the run: the grace period, and some."""
    return (record.grace_period if grace is None else grace) + 60.0


def down(store: RunStore, record: RunRecord, grace: float | None) -> tuple[StopReport, BackendReport | None]:
    """Stop every task, then release what the run's backend holds; the report, and what the
    backend says once released (None: it held nothing). The run's live controller does it with
    the connections it holds, asked at its door: here, or through the backend where it runs on
    another host (a batch job's node); else this process connects to every host."""
    from tfctl.controller.live import rpc as live
    from tfctl.controller.live.rpc_messages import DownAsk

    answer = live.ask(store.run_dir(record.run_id), record, DownAsk(grace), _down_patience(record, grace))
    if answer is not None and answer.stop is not None:
        if controller_elsewhere(record):  # it ends with the stop, and its allocation with it: say how that ended
            return answer.stop, release(record) or answer.backend
        wait_gone(record)  # a detached watcher ends once it has answered
        return answer.stop, answer.backend
    stop_watcher(record)
    with Cluster(record) as cluster:
        report, released = stop_run(store, cluster, grace)
    transitions.apply(store, record.run_id, transitions.end_if_active(RunState.STOPPED, "tfctl down", time.time()))
    return report, released


def sweep(store: RunStore, hosts: tuple[HostSpec, ...], grace: float) -> dict[str, SweepAnswer]:
    """Stop processes on these hosts that carry the marker of no live run (orphans)."""
    live = [r.run_id for r in store.all() if r.active]
    with contextlib.ExitStack() as stack:
        agents = [stack.enter_context(open_agent(spec)) for spec in hosts]
        result = fan_out(agents, lambda a: a.host, lambda a: a.call(SweepRequest(live, grace, store.store_id)))
    result.raise_if_failed("stopping orphans")
    return result.succeeded
