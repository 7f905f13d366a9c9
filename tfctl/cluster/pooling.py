"""A pool's hosts as a run sees them: what each offers, what is held there (asked of the hosts
themselves, never of a record), and a cluster file's asks placed on them.

The decisions are the engine's (`engine/placement.py`); this module reads the pool file, asks
every host for its holdings at once (`holdings`: every user's claims, and the processes on each
GPU), and writes the placement into the cluster as if its file had listed the hosts, with what
each task is to claim there at start.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from tfctl.cluster.agent import HostAgent, open_agent
from tfctl.cluster.group import fan_out
from tfctl.cluster.hosts import reach
from tfctl.config.model import CHOSEN_AT_START, Address, ClusterConfig, TaskClaim
from tfctl.config.pool import Pool, PoolHost, load_pool, pool_path
from tfctl.engine.placement import NoRoom, Offer, Placed, Taken, TaskAsk, never_fits, place
from tfctl.errors import UsageError
from tfctl.runs.record import HostSpec, Placement
from tfctl.supervisor.protocol import Holding, HoldingsRequest, QueueNote
from tfctl.supervisor.queue_records import IntentNote

LOOK_DEADLINE = 30.0  # seconds a host has to say what it holds before it counts as not answering

Progress = Callable[[str, str], None]


class NoRoomError(UsageError):
    """The run does not fit on its pool (now, or ever): the reason, and what to do."""


@dataclass(frozen=True)
class HostLook:
    """One pool host as it answered: what is claimed there, what else computes on its GPUs."""

    host: PoolHost
    held: tuple[Holding, ...] = ()
    foreign: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # GPU -> pids no claim covers
    error: str | None = None  # it did not answer: nothing is placed there
    gpu_error: str = ""
    queues: tuple[QueueNote, ...] = ()  # every user's queue note there (`controller/queue`)
    you: str = ""  # who the asker is on that host

    def open_intents(self, but: str = "") -> list[IntentNote]:
        """The starts announced there whose run does not hold its claims yet (claimed, they count
        as claims), of every queue but the run store `but`."""
        return [i for n in self.queues if n.store != but for i in n.intents if not claimed(i, self.held)]

    def taken_now(self, but: str = "") -> Taken:
        """What a run placed now cannot have here: the claims, and the starts announced."""
        taken = self.taken()
        for i in self.open_intents(but):
            taken = Taken(taken.gpus | frozenset(i.gpus), taken.cpus + i.cpus, taken.tasks + i.tasks)
        return taken

    def taken(self) -> Taken:
        """What a run placed now cannot have here."""
        names = {h.resource for h in self.held}
        gpus = {int(n[4:]) for n in names if n.startswith("gpu-")} | set(self.foreign)
        cpus = sum(1 for n in names if n.startswith("cpu-"))
        tasks = sum(1 for n in names if n.startswith("task-"))
        return Taken(frozenset(gpus), cpus, tasks)


def claimed(intent: IntentNote, held: tuple[Holding, ...]) -> bool:
    """Whether the intent's run holds on the host what it announced: its claims then count for
    it, and the intent no more (counted twice, a host would look fuller than it is)."""
    gpus = {int(h.resource[4:]) for h in held if h.run_id == intent.run_id and h.resource.startswith("gpu-")}
    tasks = {h.task for h in held if h.run_id == intent.run_id}
    return set(intent.gpus) <= gpus and len(tasks) >= intent.tasks


def pool_of(config: ClusterConfig) -> Pool:
    """The pool the cluster file names (a path relative to the file's folder)."""
    assert config.pool is not None
    return load_pool(pool_path(config.pool, config.path.parent))


def host_spec(pool: Pool, host: str) -> HostSpec:
    entry = pool.hosts[host]
    return reach(host, entry.reach, pool.ssh, entry.reach.python or pool.python)


def look(
    pool: Pool,
    accept_new_host_keys: bool = False,
    agents: Callable[[str], HostAgent] | None = None,
    note: Callable[[str], QueueNote | None] = lambda _host: None,
) -> dict[str, HostLook]:
    """Every host's holdings, asked of all at once; a host that does not answer is data.
    `agents`: connections kept open across looks (a queue's driver looks every second), else
    one opened for this look; `note`: this user's queue note to leave on each host first."""

    def ask(host: str) -> HostLook:
        if agents is not None:
            answer = agents(host).call(HoldingsRequest(note(host)))
        else:
            with open_agent(host_spec(pool, host), accept_new_host_keys) as agent:
                answer = agent.call(HoldingsRequest(note(host)))
        claimed = {int(h.resource[4:]) for h in answer.held if h.resource.startswith("gpu-")}
        foreign = {int(g): tuple(pids) for g, pids in answer.gpu_pids.items() if int(g) not in claimed}
        return HostLook(
            pool.hosts[host], tuple(answer.held), foreign, None, answer.gpu_error, tuple(answer.queues), answer.you
        )

    seen = fan_out(pool.hosts, lambda h: h, ask, deadline=LOOK_DEADLINE)
    failed = {h: HostLook(pool.hosts[h], error=str(getattr(e, "message", e))) for h, e in seen.failed.items()}
    return {h: seen.succeeded.get(h) or failed[h] for h in pool.hosts}


def offers(pool: Pool, looks: Mapping[str, HostLook] | None = None) -> list[Offer]:
    """What each host offers (of those that answered, when `looks` says)."""
    return [
        Offer(h.name, h.gpus, h.cpus, h.tasks)
        for h in pool.hosts.values()
        if looks is None or looks[h.name].error is None
    ]


def asks(config: ClusterConfig) -> list[TaskAsk]:
    return [
        TaskAsk(f"{name}:{i}", job.gpus or 0, job.cpus or 0)
        for name, job in config.jobs.items()
        for i in range(job.count or 0)
    ]


def placed_on(config: ClusterConfig, pool: Pool, placed: tuple[Placed, ...]) -> ClusterConfig:
    """The cluster as if its file had listed the placed hosts, reached as the pool says, each
    task with what it claims at start. A job's `port` goes to its first task on a host; a second
    task there gets one chosen at start."""
    jobs = {}
    for name, job in config.jobs.items():
        addresses, seen = [], set()
        for p in placed:
            if p.task.split(":")[0] == name:
                port = job.port if job.port is not None and p.host not in seen else CHOSEN_AT_START
                addresses.append(Address(p.host, port))
                seen.add(p.host)
        jobs[name] = dataclasses.replace(job, addresses=tuple(addresses))
    used = {p.host for p in placed}
    claims = {
        p.task: TaskClaim(
            p.gpus,
            p.cpus if pool.hosts[p.host].cpus else 0,
            pool.hosts[p.host].cpus or 0,
            pool.hosts[p.host].tasks or 0,
        )
        for p in placed
    }
    return dataclasses.replace(
        config,
        jobs=MappingProxyType(jobs),
        hosts=MappingProxyType({h: pool.hosts[h].reach for h in pool.hosts if h in used}),
        ssh=pool.ssh,
        python=config.python or pool.python,
        claims=MappingProxyType(claims),
    )


def placed_again(config: ClusterConfig, placement: Sequence[Placement]) -> ClusterConfig:
    """The cluster as its run's recorded placement put it (a watcher started anew, a queued
    run's start): its pool file read again for how its hosts are reached."""
    again = tuple(Placed(p.task, p.host, tuple(p.gpus), p.cpus) for p in placement)
    return placed_on(config, pool_of(config), again)


def place_now(config: ClusterConfig, progress: Progress, accept_new_host_keys: bool = False) -> ClusterConfig:
    """The run placed on what its pool's hosts have free now; NoRoomError saying why not."""
    pool = pool_of(config)
    progress("pool", f"asking the {len(pool.hosts)} hosts of pool {pool.name} what they hold")
    looks = look(pool, accept_new_host_keys)
    ever = never_fits(asks(config), offers(pool), config.placement)
    if ever is not None:
        raise never(pool, ever)
    placed = place(asks(config), offers(pool, looks), {h: v.taken_now() for h, v in looks.items()}, config.placement)
    if isinstance(placed, NoRoom):
        silent = sorted(h for h, v in looks.items() if v.error is not None)
        also = f" ({', '.join(silent)} did not answer)" if silent else ""
        raise NoRoomError(
            f"no room on pool {pool.name} now: {placed.why}{also}",
            hint=f"`tfctl pool {pool.name}` shows what holds its hosts",
        )
    where = ", ".join(
        f"{p.task} on {p.host}" + (f" (GPU {','.join(map(str, p.gpus))})" if p.gpus else "") for p in placed
    )
    progress("pool", f"placed: {where}")
    return placed_on(config, pool, placed)


def place_empty(config: ClusterConfig) -> ClusterConfig:
    """The run placed on its pool as if nothing else held it (`up --dry-run`: no host asked)."""
    pool = pool_of(config)
    placed = place(asks(config), offers(pool), {}, config.placement)
    if isinstance(placed, NoRoom):
        raise never(pool, placed)
    return placed_on(config, pool, placed)


def never(pool: Pool, why: NoRoom) -> NoRoomError:
    return NoRoomError(
        f"the run can never fit on pool {pool.name}: {why.why}",
        hint=f"ask less of each task (`gpus`, `cpus`, `count`), or add hosts to {pool.path}",
    )
