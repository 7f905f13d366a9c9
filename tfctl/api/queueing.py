"""The queue from Python: `submit` a run to its pool's queue, list the `queue`, as the `tfctl
submit` and `tfctl queue` commands do (they call these). A queued run's `Run` handle waits
through the queue (`Run.wait`), and `Run.down` takes it out if it has not started yet."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from tfctl.api.handle import Run
from tfctl.api.types import QueueEntry
from tfctl.config.model import ClusterConfig
from tfctl.runs.store import RunStore
from tfctl.supervisor.states import RunState


def submit(
    cluster: str | os.PathLike[str] | ClusterConfig,
    *,
    priority: int = 0,
    params: Mapping[str, Any] | None = None,
    home: str | os.PathLike[str] | None = None,
) -> Run:
    """Queue a run of `cluster` (a path, or one `load_cluster` parsed) on its `pool:`; it starts
    when the pool has room, by priority (higher first), fair share between users, then
    submission order. Returns at once; `NoRoomError` (a `UsageError`) if it could never fit."""
    from tfctl.api.starting import cluster_config
    from tfctl.controller.verbs.queue import submit as submit_run

    config = cluster_config(cluster, params)
    store = RunStore(None if home is None else Path(home))
    return Run(submit_run(store, config, priority).run_id, store.home)


def queue(*, home: str | os.PathLike[str] | None = None) -> list[QueueEntry]:
    """This user's queue as `tfctl queue --json` lists it: waiting runs in the order they start,
    then running ones, then those ended in the last hour. Starts the queue's driver if runs
    wait and none runs."""
    from tfctl.controller.verbs.queue import queue_view

    view = queue_view(RunStore(None if home is None else Path(home)))
    return [
        QueueEntry(
            row.record.run_id,
            row.record.state,
            row.record.priority or 0,
            row.position,
            row.why if row.record.state is RunState.QUEUED else row.record.reason,
            row.record.created_at,
            row.record.pool or "",
        )
        for row in view.rows
    ]
