"""`tfctl down` and `down --all`: stop a run's tasks (through its live controller when there is
one), release what the backend holds for it, and stop orphans that no live run owns.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from tfctl.cluster.agent import open_agent
from tfctl.cluster.answers import StopReport
from tfctl.cluster.cluster import Cluster
from tfctl.cluster.group import fan_out
from tfctl.controller.live.stopping import release, stop_run
from tfctl.controller.live.tracked import close_trackers, say_to_stderr
from tfctl.controller.live.watcher import controller_elsewhere, stop_watcher, wait_gone
from tfctl.runs import transitions
from tfctl.runs.record import HostSpec, RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import ReapAnswer, ReapRequest, RunState

if TYPE_CHECKING:
    from tfctl.backends.base import BackendReport


def _down_patience(record: RunRecord, grace: float | None) -> float:
    """How long a live controller may take to stop the run: the grace period, and some."""
    return (record.grace_period if grace is None else grace) + 60.0


def down(store: RunStore, record: RunRecord, grace: float | None) -> tuple[StopReport, BackendReport | None]:
    """Stop every task, then release what the run's backend holds; the report, and what the
    backend says once released (None: it held nothing). The run's live controller does it with
    the connections it holds, asked at its door: here, or through the backend where it runs on
    another host (a batch job's node); else this process connects to every host. A queued run
    is taken out of its queue, unless its start came first."""
    from tfctl.controller.live import rpc as live
    from tfctl.controller.live.rpc_messages import DownAsk
    from tfctl.controller.verbs.queue import cancel_queued

    if record.state is RunState.QUEUED:
        if cancel_queued(store, record):
            return StopReport(), None  # nothing of it ran anywhere
        record = store.load(record.run_id)  # its queue started it first: stopped as any run
    answer = live.ask(store.run_dir(record.run_id), record, DownAsk(grace), _down_patience(record, grace))
    if answer is not None and answer.stop is not None:
        if controller_elsewhere(record):  # it ends with the stop, and its allocation with it: say how that ended
            return answer.stop, release(record) or answer.backend
        wait_gone(record)  # a detached watcher ends once it has answered
        return answer.stop, answer.backend
    record = transitions.apply(store, record.run_id, transitions.begin_stop(time.time())) or record
    stop_watcher(record)
    with Cluster(record) as cluster:
        report, released = stop_run(store, cluster, grace)
    transitions.apply(store, record.run_id, transitions.end_if_active(RunState.STOPPED, "tfctl down", time.time()))
    close_trackers(store, record.run_id, say_to_stderr)
    return report, released


def reap_orphans(store: RunStore, hosts: tuple[HostSpec, ...], grace: float) -> dict[str, ReapAnswer]:
    """Stop processes on these hosts that carry the marker of no live run (orphans)."""
    live = [r.run_id for r in store.all() if r.active]
    with contextlib.ExitStack() as stack:
        agents = [stack.enter_context(open_agent(spec)) for spec in hosts]
        result = fan_out(agents, lambda a: a.host, lambda a: a.call(ReapRequest(live, grace, store.store_id)))
    result.raise_if_failed("stopping orphans")
    return result.succeeded
