"""`tfctl submit`, `tfctl queue` and `tfctl cancel`: a run recorded as queued (its driver starts
it when its pool has room), the queue as its driver last saw it, and runs taken out of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tfctl.cluster import pooling
from tfctl.config.model import ClusterConfig
from tfctl.controller.queue.files import Look, driver_pid, ensure_driver, read_look
from tfctl.engine.placement import never_fits
from tfctl.errors import UsageError
from tfctl.runs import transitions
from tfctl.runs.record import RunRecord
from tfctl.runs.store import RunStore, new_run_id
from tfctl.supervisor.protocol import RunState

RECENT = 3600.0  # seconds an ended run of the queue still shows in `tfctl queue`


def submit(store: RunStore, config: ClusterConfig, priority: int = 0, resumes: str | None = None) -> RunRecord:
    """Record a run of `config` as queued and see that a driver will start it; refused at once
    (NoRoomError) when it could never fit on its pool, however empty. A sweep's trial keeps
    which trial it is; `resumes`: the run whose files it continues from (`up --resume`)."""
    if config.pool is None:
        raise UsageError(
            f"{config.path} names no pool: only a run placed on a pool can wait in a queue",
            hint="add `pool: NAME` (a file in $TFCTL_HOME/pools, or a path) and ask `count`/`gpus` per job, "
            "or start it on its hosts with `tfctl up`",
        )
    pool = pooling.pool_of(config)
    ever = never_fits(pooling.asks(config), pooling.offers(pool), config.placement)
    if ever is not None:
        raise pooling.never(pool, ever)
    now = time.time()
    record = RunRecord(
        run_id=new_run_id(config.name, now),
        cluster_name=config.name,
        cluster_file=str(config.path.resolve()),
        created_at=now,
        tasks=(),
        hosts=(),
        grace_period=config.grace_period,
        store=store.store_id,
        state=RunState.QUEUED,
        backend=config.backend,
        params=dict(config.params),
        param_texts=dict(config.param_texts),
        priority=priority,
        pool=str(pool.path.resolve()),
        resumes=resumes,
        sweep=None if config.trial is None else config.trial.sweep,
        trial=None if config.trial is None else config.trial.index,
    )
    transitions.submit(store, record, config.source)
    ensure_driver(store)
    return record


def cancel_queued(store: RunStore, record: RunRecord) -> bool:
    """Take a queued run out: True, or False when it started (or ended) first."""
    cancelled = transitions.apply(store, record.run_id, transitions.cancel_queued(time.time()))
    if cancelled is not None:
        transitions.leave_queue(store, record.run_id)
    return cancelled is not None


@dataclass(frozen=True)
class QueueRow:
    """One run of the queue as `tfctl queue` shows it."""

    record: RunRecord
    position: int | None = None
    why: str | None = None

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {
            "run_id": r.run_id,
            "state": r.state.value,
            "cluster": r.cluster_name,
            "cluster_file": r.cluster_file,
            "pool": r.pool,
            "priority": r.priority,
            "submitted_at": r.created_at,
            "ended_at": r.ended_at,
            "position": self.position,
            "why": self.why if r.state is RunState.QUEUED else r.reason,
            "placement": [p.to_wire() for p in r.placement],
            "params": r.params,
        }


@dataclass(frozen=True)
class QueueView:
    """The user's queue: its runs, the driver (None: no process starts runs), its last look."""

    rows: tuple[QueueRow, ...]
    driver: int | None
    started_driver: bool
    look: Look = field(default_factory=Look)

    def to_json(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "looked_at": self.look.at or None,
            "runs": [row.to_json() for row in self.rows],
            "other_users_waiting": self.look.others,
        }


def queue_view(store: RunStore, now: float | None = None) -> QueueView:
    """Queued runs in their order, then running ones, then those ended within `RECENT`; the
    driver started first if runs wait and none runs (so the answer is never 'nobody starts it')."""
    started = ensure_driver(store)
    now = time.time() if now is None else now
    look = read_look(store)
    runs = [r for r in store.all() if r.pool is not None]
    queued = [r for r in runs if r.state is RunState.QUEUED]
    queued.sort(key=lambda r: (look.position.get(r.run_id, 10**9), r.created_at))
    live = [r for r in runs if r.active and r.state is not RunState.QUEUED]
    ended = [r for r in runs if not r.active and now - (r.ended_at or r.created_at) <= RECENT]
    rows = [QueueRow(r, look.position.get(r.run_id), look.why.get(r.run_id)) for r in queued]
    rows += [QueueRow(r) for r in live + ended]
    return QueueView(tuple(rows), driver_pid(store) if started is None else started, started is not None, look)
