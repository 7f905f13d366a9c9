"""Reading a run: what `status` shows and what `logs` prints, asked of the run's live controller
when it has one (it holds the connections), else of the hosts. The CLI and the API read through
these, so they say the same."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Generator, Iterator, Sequence

from tfctl.errors import UsageError
from tfctl.runs.record import RunRecord, TaskSpec
from tfctl.runs.store import RunStore

if TYPE_CHECKING:
    from tfctl.controller.live.rpc_messages import LogsAsk, LogsPart
    from tfctl.controller.views.status_view import Snapshot

# How long `status` waits for the run's live controller before asking the hosts itself.
STATUS_PATIENCE = 15.0


@contextlib.contextmanager
def status_asker(store: RunStore, record: RunRecord) -> Iterator[Callable[[int], tuple[Snapshot, RunRecord]]]:
    """`ask(usage_history)`: what `status` shows, and the run's record as it is now. Asked of the
    run's live controller if it has one here, which sends plain data for the asker to render,
    else of the hosts (with connections opened on the first such ask and kept for the next)."""
    from tfctl.controller.live import rpc as live
    from tfctl.controller.live.rpc_messages import StatusAsk
    from tfctl.controller.views.status_view import Snapshot

    if TYPE_CHECKING:
        from tfctl.cluster.cluster import Cluster
    run_dir = store.run_dir(record.run_id)
    with contextlib.ExitStack() as stack:
        clusters: list[Cluster] = []

        def ask(usage_history: int) -> tuple[Snapshot, RunRecord]:
            answer = live.ask(run_dir, record, StatusAsk(usage_history), STATUS_PATIENCE)
            if answer is not None:
                return Snapshot.from_plain(answer.snapshot), store.load(record.run_id)
            from tfctl.cluster.cluster import Cluster
            from tfctl.controller.views import status_view  # paramiko: only when this process asks the hosts

            if not clusters:
                clusters.append(stack.enter_context(Cluster(record)))
            return status_view.snapshot(clusters[0], usage_history), store.load(record.run_id)  # as it is now

        yield ask


def logs_parts(store: RunStore, record: RunRecord, ask: LogsAsk) -> Generator[LogsPart, None, None]:
    """`logs` of the run's current tasks, in parts: through its live controller, which reads
    them with the connections it holds, else from the hosts."""
    from tfctl.controller.live import rpc as live

    parts = live.stream(store.run_dir(record.run_id), record, ask)
    if parts is not None:
        yield from parts
        return
    from tfctl.cluster.cluster import Cluster
    from tfctl.controller.live.rpc_handlers import logs_parts as read_here

    with Cluster(record) as cluster:
        yield from read_here(store, cluster, ask, lambda: True)


def select_tasks(record: RunRecord, names: Sequence[str]) -> list[TaskSpec]:
    """The tasks `job` or `job:index` names, in that order (every task for none)."""
    if not names:
        return list(record.tasks)
    chosen = []
    for name in names:
        match = [t for t in record.tasks if name in (t.job, t.name)]
        if not match:
            valid = ", ".join(sorted({t.job for t in record.tasks} | {t.name for t in record.tasks}))
            raise UsageError(f"no task {name!r} in run {record.run_id}", hint=f"choose from: {valid}")
        chosen += [t for t in match if t not in chosen]
    return chosen
