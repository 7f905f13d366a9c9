"""Placing a run's tasks on a pool's hosts: which host, which GPUs, how many cores.

Pure: what each host offers comes from the pool file, what is taken from the hosts themselves
(their claims and the GPU processes tfctl did not start); the run's asks from its cluster file.
A run is placed whole or not at all. Each job's tasks go to one host when they fit there (a
host the run already uses first, else the one they fill best, so big holes stay for big runs);
otherwise task by task the same way. `ps_apart` keeps the ps on hosts no other job uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

TOGETHER = "together"
PS_APART = "ps_apart"


@dataclass(frozen=True)
class Offer:
    """What a pool host offers tfctl's tasks (None: not counted there)."""

    host: str
    gpus: tuple[int, ...] = ()
    cpus: int | None = None
    tasks: int | None = None


@dataclass(frozen=True)
class Taken:
    """What is held on a host now: by claims (any user's run) and by GPU processes of others."""

    gpus: frozenset[int] = frozenset()
    cpus: int = 0
    tasks: int = 0

    def plus(self, gpus: Sequence[int], cpus: int) -> Taken:
        return Taken(self.gpus | frozenset(gpus), self.cpus + cpus, self.tasks + 1)


@dataclass(frozen=True)
class TaskAsk:
    """One task's needs: `job:index`, and GPUs and cores of its own."""

    task: str
    gpus: int = 0
    cpus: int = 0

    @property
    def job(self) -> str:
        return self.task.split(":", 1)[0]


@dataclass(frozen=True)
class Placed:
    """Where one task goes, and the GPU indices it is to claim there."""

    task: str
    host: str
    gpus: tuple[int, ...] = ()
    cpus: int = 0


@dataclass(frozen=True)
class NoRoom:
    """Why the run does not fit now (or, against empty hosts, ever)."""

    why: str


@dataclass(frozen=True)
class _Free:
    """A host's room left while a run is being placed."""

    offer: Offer
    taken: Taken = field(default_factory=Taken)

    def free_gpus(self) -> tuple[int, ...]:
        return tuple(g for g in self.offer.gpus if g not in self.taken.gpus)

    def free_cpus(self) -> int | None:
        return None if self.offer.cpus is None else self.offer.cpus - self.taken.cpus

    def free_tasks(self) -> int | None:
        return None if self.offer.tasks is None else self.offer.tasks - self.taken.tasks

    def fits(self, asks: Sequence[TaskAsk]) -> bool:
        cpus, tasks = self.free_cpus(), self.free_tasks()
        return (
            sum(a.gpus for a in asks) <= len(self.free_gpus())
            and (cpus is None or sum(a.cpus for a in asks) <= cpus)
            and (tasks is None or len(asks) <= tasks)
        )

    def leftover(self, asks: Sequence[TaskAsk]) -> tuple[int, int]:
        """GPUs then cores left once `asks` are here: the smaller, the better they fill it."""
        return len(self.free_gpus()) - sum(a.gpus for a in asks), (self.free_cpus() or 0) - sum(a.cpus for a in asks)


def place(
    asks: Sequence[TaskAsk], offers: Sequence[Offer], taken: Mapping[str, Taken], how: str = TOGETHER
) -> tuple[Placed, ...] | NoRoom:
    """Every task placed, in task order; or why the run does not fit."""
    free = {o.host: _Free(o, taken.get(o.host, Taken())) for o in offers}
    placed: list[Placed] = []
    jobs = list(dict.fromkeys(a.job for a in asks))
    for job in jobs:
        tasks = [a for a in asks if a.job == job]
        allowed = _allowed(job, placed, list(free), how)
        used = [p.host for p in placed]
        whole = [h for h in allowed if free[h].fits(tasks)]
        if whole:
            host = _best(whole, tasks, free, used)
            for a in tasks:
                placed.append(_take(free, host, a))
            continue
        for a in tasks:
            fitting = [h for h in _allowed(job, placed, list(free), how) if free[h].fits([a])]
            if not fitting:
                return NoRoom(_why(a, [free[h] for h in allowed], how))
            placed.append(_take(free, _best(fitting, [a], free, [p.host for p in placed]), a))
    return tuple(sorted(placed, key=lambda p: _order(asks, p.task)))


def never_fits(asks: Sequence[TaskAsk], offers: Sequence[Offer], how: str = TOGETHER) -> NoRoom | None:
    """Why the run would not fit on the pool even with nothing else on it: refused at submit."""
    tried = place(asks, offers, {}, how)
    return tried if isinstance(tried, NoRoom) else None


def _allowed(job: str, placed: Sequence[Placed], hosts: list[str], how: str) -> list[str]:
    """With `ps_apart`, the ps only where no other job is, and the others only where no ps is."""
    if how != PS_APART:
        return hosts
    apart = {p.host for p in placed if (p.task.split(":")[0] == "ps") != (job == "ps")}
    return [h for h in hosts if h not in apart]


def _best(hosts: Sequence[str], asks: Sequence[TaskAsk], free: Mapping[str, _Free], used: Sequence[str]) -> str:
    """A host the run uses already, else the one the asks fill best; ties by name."""
    return min(hosts, key=lambda h: (h not in used, free[h].leftover(asks), h))


def _take(free: dict[str, _Free], host: str, ask: TaskAsk) -> Placed:
    room = free[host]
    gpus = room.free_gpus()[: ask.gpus]
    free[host] = replace(room, taken=room.taken.plus(gpus, ask.cpus))
    return Placed(ask.task, host, gpus, ask.cpus)


def _order(asks: Sequence[TaskAsk], task: str) -> int:
    return next(i for i, a in enumerate(asks) if a.task == task)


def _why(ask: TaskAsk, hosts: Sequence[_Free], how: str) -> str:
    """`worker:0 needs 2 GPUs on one host; the most free on any host is 1`."""
    where = " apart from the other jobs" if how == PS_APART and ask.job == "ps" else ""
    where = where or (" apart from the ps" if how == PS_APART else "")
    if not hosts:
        return f"{ask.task} needs a host{where}; the pool has none left"
    most_gpus = max(len(h.free_gpus()) for h in hosts)
    if ask.gpus > most_gpus:
        return f"{ask.task} needs {_n(ask.gpus, 'GPU')} on one host{where}; the most free on any host is {most_gpus}"
    counted = [h.free_cpus() for h in hosts if h.free_cpus() is not None and len(h.free_gpus()) >= ask.gpus]
    if ask.cpus and counted and len(counted) == len(hosts):
        most = max(c for c in counted if c is not None)
        if ask.cpus > most:
            return (
                f"{ask.task} needs {_n(ask.cpus, 'CPU core')} on one host{where}; the most free on any host is {most}"
            )
    return f"{ask.task} needs room for one more task{where}; every host that has its GPUs and cores is full"


def _n(count: int, kind: str) -> str:
    return f"{count} {kind}{'s' if count != 1 else ''}"
