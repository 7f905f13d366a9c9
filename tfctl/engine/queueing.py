"""A pool's queue: which queued runs start now, where, and why the others wait.

Pure, on the time passed in. Order: priority first; within a priority, the user who holds the
least of the pool now goes first (so two users with runs waiting share it, not first-come-takes-
all), then submission order. A run that does not fit now lets the runs behind it start where they
fit (the pool stays used), until it has waited `PATIENCE`: then nothing behind it starts before
it, so a big run is never starved by a stream of small ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from tfctl.engine.placement import NoRoom, Offer, Placed, Taken, TaskAsk, place

PATIENCE = 300.0  # seconds a run that does not fit lets later ones pass it


@dataclass(frozen=True)
class Queued:
    """A run waiting in the queue, as its record says."""

    run_id: str
    user: str
    submitted_at: float
    asks: tuple[TaskAsk, ...]
    priority: int = 0
    how: str = "together"


@dataclass(frozen=True)
class Share:
    """What a user holds of the pool now: GPUs first, then tasks (`fair` compares these)."""

    gpus: int = 0
    tasks: int = 0

    def plus(self, placed: Sequence[Placed]) -> Share:
        return Share(self.gpus + sum(len(p.gpus) for p in placed), self.tasks + len(placed))


@dataclass(frozen=True)
class Decision:
    """Start these runs on these tasks' hosts; the others wait, each with why."""

    start: tuple[tuple[str, tuple[Placed, ...]], ...]
    waiting: Mapping[str, str]
    position: Mapping[str, int]  # run id -> 1-based place in the queue's order


def decide(
    queued: Sequence[Queued],
    offers: Sequence[Offer],
    taken: Mapping[str, Taken],
    shares: Mapping[str, Share],
    now: float,
) -> Decision:
    """One look at the queue: place runs in order until the pool is full or a run waited too long."""
    held = dict(taken)
    share = dict(shares)
    left = list(queued)
    start: list[tuple[str, tuple[Placed, ...]]] = []
    waiting: dict[str, str] = {}
    position = {q.run_id: i + 1 for i, q in enumerate(order(queued, shares))}
    blocked = False
    while left:
        run = order(left, share)[0]
        left.remove(run)
        if blocked:
            waiting[run.run_id] = "behind a run that has waited longest for room"
            continue
        placed = place(run.asks, offers, held, run.how)
        if isinstance(placed, NoRoom):
            waiting[run.run_id] = placed.why
            blocked = now - run.submitted_at >= PATIENCE
            continue
        start.append((run.run_id, placed))
        share[run.user] = share.get(run.user, Share()).plus(placed)
        for p in placed:
            held[p.host] = held.get(p.host, Taken()).plus(p.gpus, p.cpus)
    return Decision(tuple(start), waiting, position)


def order(queued: Sequence[Queued], shares: Mapping[str, Share]) -> list[Queued]:
    """Priority (higher first), then the user holding least, then the earliest submitted."""

    def key(q: Queued) -> tuple[int, int, int, float, str]:
        held = shares.get(q.user, Share())
        return (-q.priority, held.gpus, held.tasks, q.submitted_at, q.run_id)

    return sorted(queued, key=key)


@dataclass(frozen=True)
class Intent:
    """A start a queue is about to make on one host, written there before it starts; `written`:
    when, by that host's clock (the one clock every user's intent there is stamped with)."""

    run_id: str
    written: float
    gpus: frozenset[int] = frozenset()
    cpus: int = 0
    tasks: int = 0


def yields(mine: Intent, others: Sequence[Intent], offer: Offer, taken: Taken) -> bool:
    """Whether `mine` must wait: one of its GPUs is claimed now, or an intent written no later
    than it wants one, or with it would take more cores or task slots than the host offers.

    Each queue writes its intent on the host, then reads every intent there. Of two for the same
    room, the one written second always sees the first and waits; the first goes whether or not
    it saw the second (written after it: it waits). A tie makes both wait for their next look:
    never both go. Which run deserves the room was the queue's order (`decide`) to say."""
    ahead = [o for o in others if o.run_id != mine.run_id and o.written <= mine.written]
    if mine.gpus & taken.gpus or any(o.gpus & mine.gpus for o in ahead):
        return True
    cpus = taken.cpus + mine.cpus + sum(o.cpus for o in ahead)
    tasks = taken.tasks + mine.tasks + sum(o.tasks for o in ahead)
    return bool(offer.cpus is not None and cpus > offer.cpus or offer.tasks is not None and tasks > offer.tasks)
