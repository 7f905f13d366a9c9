"""The queue's driver: one process per user and run store that starts queued runs when their
pool has room, as a detached `up` would, and ends itself once nothing waits.

Each look (every `LOOK_EVERY` seconds) asks every host of each pool with runs waiting what is
held there, leaving this user's queue note on the way (its waiting runs, its starts in flight)
and reading every other user's; the engine (`engine/queueing.py`) then orders all users' waiting
runs and places them. A run of this user's that the order starts is first announced on its
hosts as an intent, read back beside the other users' intents, and started only if none ranked
before it wants the same room (`queueing.yields`): two users' queues never pick the same GPU,
and the host's claims (`supervisor/claims.py`) hold even if they did.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from tfctl.cluster import pooling
from tfctl.cluster.agent import HostAgent, open_agent
from tfctl.config.model import ClusterConfig
from tfctl.config.pool import Pool, load_pool
from tfctl.controller.live import driver as live_driver
from tfctl.controller.live.resubmit import recorded_config
from tfctl.controller.live.spawn import relay, spawner
from tfctl.controller.live.watcher import controller_gone, controller_of
from tfctl.controller.queue.files import Look, driver_lock, ensure_driver, write_look
from tfctl.controller.start.plan import drafted
from tfctl.engine.clock import REAL_CLOCK, Clock
from tfctl.engine.placement import Placed, TaskAsk, never_fits
from tfctl.engine.queueing import Intent, Queued, Share, decide, yields
from tfctl.errors import HostError, TfctlError
from tfctl.runs import transitions
from tfctl.runs.record import ControllerKind, RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState
from tfctl.supervisor.queue_records import AskNote, IntentNote, QueueNote, WaitingNote

LOOK_EVERY = 0.5  # seconds between looks while runs wait
ASK_SILENT_EVERY = 5.0  # seconds between two tries of a host that did not answer
ORPHANS_EVERY = 5.0  # seconds between looks for queued runs' watchers that died


@dataclass
class Waiting:
    """One of this user's queued runs, parsed once: its record, its cluster, its queue entry."""

    record: RunRecord
    config: ClusterConfig
    queued: Queued


@dataclass
class InFlight:
    """A start this driver made whose tasks may not hold their claims yet: its room, per host."""

    run_id: str
    pool: str
    intents: dict[str, IntentNote]
    since: float


class QueueDriver:
    """Looks, decides, starts; `once` is one look at every pool with runs waiting."""

    def __init__(self, store: RunStore, clock: Clock = REAL_CLOCK, user: str | None = None) -> None:
        self.store = store
        self.clock = clock
        self.user = user or _user_name()
        self.agents: dict[tuple[str, str], HostAgent] = {}
        self.parsed: dict[str, Waiting] = {}
        self.in_flight: dict[str, InFlight] = {}
        self.noted: set[str] = set()  # pools whose hosts hold a note of this user's queue
        self.orphans_seen = -ORPHANS_EVERY
        self.silent: dict[tuple[str, str], tuple[float, str]] = {}  # host -> since, why (not answering)

    def run(self) -> None:
        """Drive until nothing waits; a second driver of the same store leaves at once."""
        with driver_lock(self.store) as mine:
            if not mine:
                return
            try:
                while self._once_surviving():
                    self.clock.sleep(LOOK_EVERY)
            finally:
                self._close()
        ensure_driver(self.store)  # a run submitted as this one was leaving found its lock still held

    def _once_surviving(self) -> bool:
        """`once`, a fault of one look logged and the next look made as usual: the driver is all
        that starts the queued runs, and a disk that was full a second ago may not be now."""
        try:
            return self.once()
        except Exception:  # noqa: BLE001 - logged whole; the queue must go on
            _say("a look failed (the next one follows):\n" + traceback.format_exc())
            return True

    def once(self) -> bool:
        """One look and the starts it allows; False once no run waits and none is in flight."""
        if self.clock.monotonic() - self.orphans_seen >= ORPHANS_EVERY:
            self._resume_orphans()
        waiting = self._waiting()
        self._settle_in_flight()
        look = Look(at=self.clock.time(), driver=os.getpid())
        pools = sorted({w.record.pool or "" for w in waiting.values()} | {f.pool for f in self.in_flight.values()})
        for path in pools:
            mine = [w for w in waiting.values() if w.record.pool == path]
            try:
                pool = load_pool(Path(path))
            except TfctlError as e:
                look.why.update({w.record.run_id: f"its pool file cannot be read: {e.message}" for w in mine})
                continue
            self._drive_pool(pool, mine, look)
        for path in self.noted - set(pools):  # its runs all started or left: its note goes
            self._clear_note(path)
        write_look(self.store, look)
        return bool(waiting or self.in_flight)

    # -- reading the queue

    def _waiting(self) -> dict[str, Waiting]:
        """This user's queued runs; a mark whose run started, ended or went is removed."""
        found = {}
        for run_id in self.store.queued_ids():
            try:
                record = self.store.load(run_id) if self.store.exists(run_id) else None
            except TfctlError as e:  # damaged, or a newer tfctl's: not this driver's to start
                _say(f"run {run_id}: {e.message}; left out of the queue")
                transitions.leave_queue(self.store, run_id)
                continue
            if record is None or record.state is not RunState.QUEUED:
                transitions.leave_queue(self.store, run_id)
                self.parsed.pop(run_id, None)
                continue
            if run_id not in self.parsed:
                try:
                    config = recorded_config(self.store, record)
                except TfctlError as e:  # its kept file no longer parses (a pool file gone): it cannot start
                    self._end(record, f"cannot start: {e.message}")
                    continue
                asks = tuple(pooling.asks(config))
                queued = Queued(run_id, self.user, record.created_at, asks, record.priority or 0, config.placement)
                self.parsed[run_id] = Waiting(record, config, queued)
            found[run_id] = self.parsed[run_id]
        return found

    def _settle_in_flight(self) -> None:
        """A start whose run ended, or whose watcher died, holds no room of its own (one whose
        claims show is settled by the look: `_drive_pool`). No time limit: a start may sync
        code and run `setup` for minutes before its tasks claim anything."""
        for run_id in list(self.in_flight):
            record = self.store.load(run_id) if self.store.exists(run_id) else None
            if record is None or record.state is not RunState.STARTING:
                del self.in_flight[run_id]
            elif record.watcher is not None and controller_gone(record):
                del self.in_flight[run_id]

    # -- one pool

    def _drive_pool(self, pool: Pool, mine: list[Waiting], look: Look) -> None:
        notes = _waiting_notes(mine)
        looks = self._look(pool, notes)
        for run_id, flight in list(self.in_flight.items()):  # its tasks hold their claims now: those count
            if flight.pool == str(pool.path) and all(
                h in looks and pooling.claimed(i, looks[h].held) for h, i in flight.intents.items()
            ):
                del self.in_flight[run_id]
        others = [n for v in looks.values() for n in v.queues if n.store != self.store.store_id]
        me = next((v.you for v in looks.values() if v.you), self.user)  # as the hosts name this user
        queued = [dataclasses.replace(w.queued, user=me) for w in mine] + _their_queued(others, pool)
        taken = {h: v.taken_now() for h, v in looks.items()}  # every start announced counts, this queue's too
        decision = decide(queued, pooling.offers(pool, looks), taken, _shares(looks), self.clock.time())
        ids = {w.record.run_id: w for w in mine}
        silent = sorted(f"{h} ({v.error})" for h, v in looks.items() if v.error is not None)
        also = f"; did not answer: {', '.join(silent)}" if silent else ""
        look.position.update({i: p for i, p in decision.position.items() if i in ids})
        look.why.update({i: why + also for i, why in decision.waiting.items() if i in ids})
        for note in others:
            look.others[note.user] = max(look.others.get(note.user, 0), len(note.waiting))
        for run_id, placed in decision.start:
            if run_id in ids:
                why = self._start(pool, ids[run_id], placed)
                if why:
                    look.why[run_id] = why

    def _look(self, pool: Pool, waiting: list[WaitingNote]) -> dict[str, pooling.HostLook]:
        path = str(pool.path)

        def note(host: str) -> QueueNote:
            intents = [f.intents[host] for f in self.in_flight.values() if host in f.intents]
            return QueueNote(self.user, store=self.store.store_id, waiting=waiting, intents=intents)

        looks = pooling.look(pool, agents=lambda host: self._agent(pool, host), note=note)
        now = self.clock.monotonic()
        for host, seen in looks.items():
            key = (path, host)
            if seen.error is None:
                self.silent.pop(key, None)
            elif key not in self.silent:  # a new connection, but not before `ASK_SILENT_EVERY`
                self.silent[key] = (now, seen.error)
                agent = self.agents.pop(key, None)
                if agent is not None:
                    agent.close()
        self.noted.add(path)
        return looks

    # -- starting one run

    def _start(self, pool: Pool, waiting: Waiting, placed: tuple[Placed, ...]) -> str | None:
        """Announce the run's room on its hosts, start it unless another user's start ranked
        before it wants that room: None once started, else why it still waits."""
        record = waiting.record
        intents: dict[str, IntentNote] = {}
        for p in placed:
            now = intents.get(p.host) or IntentNote(record.run_id)
            intents[p.host] = now.replace(gpus=[*now.gpus, *p.gpus], cpus=now.cpus + p.cpus, tasks=now.tasks + 1)
        flight = InFlight(record.run_id, str(pool.path), intents, self.clock.time())
        self.in_flight[record.run_id] = flight
        looks = self._look(pool, _waiting_notes([w for w in self.parsed.values() if w.record.pool == str(pool.path)]))
        offers = {o.host: o for o in pooling.offers(pool)}
        for host in intents:
            seen = looks.get(host)
            if seen is None or seen.error is not None:
                del self.in_flight[record.run_id]
                return f"{host} did not answer as the run was to start there: waits for the next look"
            ours = [i for n in seen.queues if n.store == self.store.store_id for i in n.intents]
            mine = next((_intent(i) for i in ours if i.run_id == record.run_id), None)  # as the host stamped it
            others = [_intent(i) for i in seen.open_intents() if i.run_id != record.run_id]  # ours in flight too
            if mine is None or yields(mine, others, offers[host], seen.taken()):
                del self.in_flight[record.run_id]
                return f"another run is starting on {host}: waits for the next look"
        try:
            self._launch(waiting, placed, pool)
        except TfctlError as e:
            del self.in_flight[record.run_id]
            return f"could not start: {e.message}"
        return None

    def _launch(self, waiting: Waiting, placed: tuple[Placed, ...], pool: Pool) -> None:
        """The run recorded as starting (unless cancelled meanwhile) and its watcher started, as
        `up -d`'s; a thread reads its reports and ends the run if the watcher died first."""
        record = waiting.record
        config = pooling.placed_on(waiting.config, pool, placed)
        draft = drafted(config, self.store, record.run_id, None)
        # No watcher until its process exists: a `down` in between ends the run, which its watcher
        # then finds (and starts nothing); a driver killed in between leaves it to go back in line.
        taken = transitions.apply(self.store, record.run_id, transitions.take_from_queue(draft.record))
        transitions.leave_queue(self.store, record.run_id)
        self.parsed.pop(record.run_id, None)
        if taken is None:  # cancelled in between
            del self.in_flight[record.run_id]
            return
        try:
            started = spawner(self.store, False)(dataclasses.replace(draft, record=taken))
        except OSError as e:
            del self.in_flight[record.run_id]
            self._end(taken, f"could not start its watcher: {e.strerror}")
            return
        transitions.apply(
            self.store, record.run_id, transitions.take_control(controller_of(started.pid, ControllerKind.WATCHER))
        )
        _say(f"run {record.run_id}: started (watcher pid {started.pid}) on {_where(placed)}")

        def follow() -> None:
            with started.reports:
                final = relay(started.reports, lambda _who, _what: None)
            started.reap()
            if final.get("gone") and self.store.exists(record.run_id):
                live_driver.resume(self.store, self.store.load(record.run_id))
            _say(
                f"run {record.run_id}: " + ("running" if "running" in final else f"start failed: {final.get('error')}")
            )

        threading.Thread(target=follow, name=f"follow {record.run_id}", daemon=True).start()

    # -- upkeep

    def _end(self, record: RunRecord, why: str) -> None:
        transitions.apply(self.store, record.run_id, transitions.end_if_active(RunState.FAILED, why, self.clock.time()))
        transitions.leave_queue(self.store, record.run_id)

    def _resume_orphans(self) -> None:
        """The queue's runs whose watcher died (killed with every tfctl process of the user):
        one cut off in its start is ended (what it started stopped), a running one gets a new
        watcher, as any tfctl command about the run would do (`driver.resume`)."""
        self.orphans_seen = self.clock.monotonic()
        for record in self.store.all():
            if record.pool is not None and record.active and record.state is not RunState.QUEUED:
                if record.run_id in self.in_flight:
                    continue  # its watcher is being started right now
                if transitions.apply(self.store, record.run_id, transitions.back_to_queue()) is not None:
                    transitions.rejoin_queue(self.store, record.run_id)  # taken by a driver that died at once
                    _say(f"run {record.run_id}: back in the queue (its start had not begun)")
                    continue
                note = live_driver.resume(self.store, record)
                if note:
                    _say(note)

    def _agent(self, pool: Pool, host: str) -> HostAgent:
        """The host's kept connection; a host that did not answer is asked again only every
        `ASK_SILENT_EVERY` seconds (reconnecting twice a second would flood its sshd)."""
        key = (str(pool.path), host)
        silent = self.silent.get(key)
        if silent is not None:
            if self.clock.monotonic() - silent[0] < ASK_SILENT_EVERY:
                raise HostError(host, silent[1].removeprefix(f"{host}: "))
            del self.silent[key]
        if key not in self.agents:
            self.agents[key] = open_agent(pooling.host_spec(pool, host))
        return self.agents[key]

    def _clear_note(self, path: str) -> None:
        try:
            pool = load_pool(Path(path))
            gone = QueueNote(self.user, store=self.store.store_id)
            pooling.look(pool, agents=lambda host: self._agent(pool, host), note=lambda _h: gone)
        except TfctlError:
            pass  # its notes run out by themselves (`claims.QUEUE_NOTE_TTL`)
        self.noted.discard(path)

    def _close(self) -> None:
        for path in list(self.noted):
            self._clear_note(path)
        for agent in self.agents.values():
            agent.close()
        self.agents.clear()


def _waiting_notes(mine: list[Waiting]) -> list[WaitingNote]:
    return [
        WaitingNote(
            w.queued.run_id,
            w.queued.submitted_at,
            w.queued.priority,
            w.queued.how,
            [AskNote(a.task, a.gpus, a.cpus) for a in w.queued.asks],
        )
        for w in mine
    ]


def _their_queued(others: list[QueueNote], pool: Pool) -> list[Queued]:
    """Other queues' waiting runs, once each (every host of the pool holds the same note), but
    for those that could never fit this pool (a note on a host of another pool too): they would
    block this queue's order once they waited their patience, for a room it never has."""
    offers = pooling.offers(pool)
    seen: dict[str, Queued] = {}
    for note in others:
        for w in note.waiting:
            asks = tuple(TaskAsk(a.task, a.gpus, a.cpus) for a in w.asks)
            if w.run_id not in seen and never_fits(asks, offers, w.how) is None:
                seen[w.run_id] = Queued(w.run_id, note.user, w.submitted_at, asks, w.priority, w.how)
    return list(seen.values())


def _shares(looks: Mapping[str, pooling.HostLook]) -> dict[str, Share]:
    """What each user holds of the pool now, as its hosts' claims say."""
    gpus: dict[str, int] = {}
    tasks: dict[str, set[tuple[str, str]]] = {}
    for seen in looks.values():
        for h in seen.held:
            if h.resource.startswith("gpu-"):
                gpus[h.user] = gpus.get(h.user, 0) + 1
            tasks.setdefault(h.user, set()).add((h.run_id, h.task))
    return {u: Share(gpus.get(u, 0), len(tasks.get(u, ()))) for u in set(gpus) | set(tasks)}


def _intent(note: IntentNote) -> Intent:
    return Intent(note.run_id, note.written, frozenset(note.gpus), note.cpus, note.tasks)


def _where(placed: tuple[Placed, ...]) -> str:
    return ", ".join(
        f"{p.task} on {p.host}" + (f" (GPU {','.join(map(str, p.gpus))})" if p.gpus else "") for p in placed
    )


def _say(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}", flush=True)


def _user_name() -> str:
    """This user as the hosts' notes name users (by uid, not by $USER, which a `su` keeps)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
