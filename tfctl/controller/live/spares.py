"""A lost host's tasks moved to a spare host instead of failing the run.

`plan_move` decides, from the run's record alone: which spare, each moved task's new spec, and
which tasks elsewhere must start again with the new address (`tf/moves.py` says which). `Mover`
carries it out from the supervision loop: stop those tasks, record the move, start the moved and
restarted tasks through the usual start (listening, reachability), tell `notify:`. The lost host
leaves the run but stays on its record (`lost_hosts`) until it is seen to stop what it ran: a
host that was only frozen comes back with its tasks, which must not train beside their moved
selves, so the controller keeps asking it to stop them, and `down` asks it too.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tfctl.cluster import control
from tfctl.cluster.cluster import LOST_HOST_PATIENCE, Cluster
from tfctl.config.model import host_port
from tfctl.controller.live.notify import EventKind, Notifier, RunEvent
from tfctl.controller.live.restarting import Restarting
from tfctl.errors import HostError, TfctlError
from tfctl.runs import transitions
from tfctl.runs.record import Move, RunRecord, TaskSpec
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import StatusRequest
from tfctl.tf import moves as tf_moves
from tfctl.tf.tasks import start_phases

SPARE_PATIENCE = 10.0  # seconds a spare whose move failed has to answer, before the next spare is tried
RETIRE_POLL = 5.0  # seconds between two requests that a host the run left stop what it ran


@dataclass(frozen=True)
class MovePlan:
    """What moving the lost host's tasks to a spare changes: the tasks as they will run."""

    lost: str
    spare: str
    why: str
    moved: tuple[TaskSpec, ...]  # the lost host's tasks, now on the spare
    restarted: tuple[TaskSpec, ...]  # tasks elsewhere started again with the new addresses
    tasks: tuple[TaskSpec, ...]  # every task of the run after the move
    ended: tuple[str, ...] = ()  # tasks that ended badly while the lost host was silent: among `restarted`

    def record_moves(self, at: float) -> tuple[Move, ...]:
        restarted = tuple(t.name for t in self.restarted)
        return tuple(Move(at, t.name, self.lost, self.spare, self.why, restarted) for t in self.moved)


def plan_move(
    record: RunRecord, host: str, why: str, restart_all: bool = False, ended: tuple[str, ...] = ()
) -> MovePlan | None:
    """The move of `host`'s tasks to the first spare left; None when there is none (or the host
    runs no task): the run fails as it would without spares. `restart_all`: every other task
    starts again too (a failed move stopped them all); `ended`: these start again too (they
    failed while the host was silent)."""
    lost = [t for t in record.tasks if t.host == host]
    if not record.spares or not lost:
        return None
    spare = record.spares[0]
    swaps = {t.address: host_port(spare, t.port) for t in lost}
    names = {t.name for t in lost}
    peers = (
        {t.name for t in record.tasks}
        if restart_all
        else {peer for t in lost for peer in tf_moves.peers_to_restart(record.tasks, t.name)}
    )
    again = (peers | set(ended)) - names
    tasks = tuple(
        tf_moves.readdressed(t, swaps).replace(host=spare)
        if t.name in names
        else tf_moves.readdressed(t, swaps)
        if t.name in again
        else t
        for t in record.tasks
    )
    return MovePlan(
        host,
        spare,
        why,
        tuple(t for t in tasks if t.name in names),
        tuple(t for t in tasks if t.name in again),
        tasks,
        tuple(name for name in ended if name in again),
    )


class Mover:
    """The supervision loop's `on_lost`: a lost host's tasks moved to a spare, one spare per lost
    host, for as long as spares are left."""

    def __init__(
        self,
        store: RunStore,
        cluster: Cluster,
        notifier: Notifier,
        restarting: Restarting | None = None,
    ) -> None:
        self.store, self.cluster, self.notifier = store, cluster, notifier
        self.restarting = restarting or Restarting()

    def __call__(self, host: str, why: str, ended: tuple[str, ...] = ()) -> bool:
        """Move `host`'s tasks, starting again those `ended` badly elsewhere while it was silent; a
        spare that fails them (silent when its turn came) is lost in its turn, and the next spare
        takes them, every task starting again (the failure stopped all)."""
        restart_all = False
        while True:
            plan = plan_move(self.cluster.record, host, why, restart_all, ended)
            if plan is None or not self.store.load(self.cluster.record.run_id).active:  # none left, or `down`
                return False
            try:
                self.carry_out(plan)
                return True
            except TfctlError as e:
                self.notifier.say(f"error: moving {host}'s tasks to {plan.spare} failed: {e.message}")
                if not self._took_and_lost(plan):
                    return False
                first = e.message.splitlines()[0]
                host, why, restart_all = plan.spare, f"spare {plan.spare} failed: {first}", True

    def _took_and_lost(self, plan: MovePlan) -> bool:
        """The move got as far as giving the spare its tasks, and the spare does not answer."""
        if self.cluster.record.task(plan.moved[0].name).host != plan.spare:
            return False
        try:
            self.cluster.agents[plan.spare].call(StatusRequest(self.cluster.record.run_id, {}), timeout=SPARE_PATIENCE)
        except HostError:
            return True
        return False

    def carry_out(self, plan: MovePlan) -> None:
        """Stop the tasks that restart, record the move, start the moved and restarted tasks as a
        run's tasks start. The lost host leaves the run; what it ran is stopped once it answers."""
        cluster, record = self.cluster, self.cluster.record

        def say(who: str, message: str) -> None:
            self.notifier.say(f"{who}: {message}" if who else message)

        moved = ", ".join(t.name for t in plan.moved)
        say("", f"{plan.why}: moving {moved} to spare {plan.spare}")
        if plan.ended:
            say("", f"{', '.join(plan.ended)} ended while {plan.lost} was silent: starting again with the move")
        readdressed = [t.name for t in plan.restarted if t.name not in plan.ended]
        if readdressed:
            say("", f"restarting {', '.join(readdressed)}: their cluster names the new address")
        if plan.restarted:
            cluster.stop_tasks([record.task(t.name) for t in plan.restarted])
        moves = plan.record_moves(time.time())
        cluster.apply(self.store, transitions.record_move(plan.lost, plan.spare, plan.tasks, moves))
        self.retire(plan.lost)
        starting = [t for t in plan.tasks if t in plan.moved or t in plan.restarted]
        again = f"moved{len(cluster.record.moves)}"  # what the restarted tasks left: set aside
        names = [t.name for t in starting]
        self.restarting.before(names)
        try:
            control.start(cluster, start_phases(starting, "together"), record.startup_timeout, say, again=again)
        finally:  # started or failed, what they printed is theirs to show
            self.restarting.after(names)
        for t in plan.moved:
            reason = f"{t.name} moved from {plan.lost} to {plan.spare}: {plan.why}"
            self.notifier.send(RunEvent.of(cluster.record, EventKind.MOVED, reason, t.name))

    def retire(self, host: str) -> None:
        """`host` has left the run: renew no lease there, and stop what it ran once it answers.
        Also for the hosts a run left under an earlier controller (one that died)."""
        self.cluster.leave(host)
        threading.Thread(target=self._retire, args=(host,), daemon=True, name=f"retire {host}").start()

    def _retire(self, host: str) -> None:
        """Ask `host` to stop what the run left there until it answers (or the controller closes),
        then strike it off the record's lost hosts."""
        cluster, said = self.cluster, False
        while not cluster.closing.wait(RETIRE_POLL):
            try:
                answer = cluster.stop_left_behind(host, LOST_HOST_PATIENCE)
            except TfctlError:
                continue  # still silent
            if answer.remaining:  # (in uninterruptible sleep on a hung filesystem): asked again
                if not said:
                    pids = ", ".join(map(str, answer.remaining))
                    self.notifier.say(f"{host} answers again, but processes of the run survive SIGKILL there: {pids}")
                    said = True
                continue
            cluster.apply(self.store, transitions.retire_host(host))
            self.notifier.say(
                f"{host} answers again: stopped the {answer.processes} process(es) of the run it still had"
            )
            return
