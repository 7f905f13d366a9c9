"""A lost host's tasks moved to a spare host instead of failing the run.

`engine.moving.plan_move` decides, from the run's record alone: which spare, each moved task's
new spec, and which tasks elsewhere must start again with the new address (`tf/moves.py` says
which), what is said and told of it, and whether the next spare takes them when a move fails.
`Mover` carries it out from the supervision loop: stop those tasks, record the move, start the
moved and restarted tasks through the usual start (listening, reachability); its lines and
events go through the live run's one `carry_out`. The lost host leaves the run but stays on its
record (`lost_hosts`) until it is seen to stop what it ran: a host that was only frozen comes
back with its tasks, which must not train beside their moved selves, so the controller keeps
asking it to stop them, and `down` asks it too.
"""

from __future__ import annotations

from typing import Callable

from tfctl.cluster import control
from tfctl.cluster.cluster import Cluster
from tfctl.controller.live.restarting import Restarting
from tfctl.engine.clock import REAL_CLOCK, Clock
from tfctl.engine.moving import MovePlan, after_failed_move, plan_move
from tfctl.engine.reconcile import Action, Say
from tfctl.errors import HostError, TfctlError
from tfctl.runs import transitions
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import StatusRequest
from tfctl.tf import moves as tf_moves
from tfctl.tf.tasks import start_phases

SPARE_PATIENCE = 10.0  # seconds a spare whose move failed has to answer, before the next spare is tried


class Mover:
    """The supervision loop's `on_lost`: a lost host's tasks moved to a spare, one spare per lost
    host, for as long as spares are left."""

    def __init__(
        self,
        store: RunStore,
        cluster: Cluster,
        carry_out: Callable[[Action], None],
        restarting: Restarting | None = None,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.store, self.cluster, self.carry_out_action = store, cluster, carry_out
        self.restarting = restarting or Restarting()
        self.clock = clock  # the time a move is recorded at: the supervision's

    def __call__(self, host: str, why: str, ended: tuple[str, ...] = ()) -> bool:
        """Move `host`'s tasks, starting again those `ended` badly elsewhere while it was silent; a
        spare that fails them is lost in its turn when `engine.moving` says so, and the next spare
        takes them."""
        restart_all = False
        while True:
            plan = plan_move(self.cluster.record, host, why, tf_moves, restart_all, ended)
            if plan is None or not self.store.load(self.cluster.record.run_id).active:  # none left, or `down`
                return False
            try:
                self.carry_out(plan)
                return True
            except TfctlError as e:
                self.carry_out_action(Say(f"error: moving {host}'s tasks to {plan.spare} failed: {e.message}"))
                took = self.cluster.record.task(plan.moved[0].name).host == plan.spare
                following = after_failed_move(plan, took, took and self._answers(plan.spare), e.message)
                if following is None:
                    return False
                host, why, restart_all = following.host, following.why, following.restart_all

    def _answers(self, spare: str) -> bool:
        """The spare answers within SPARE_PATIENCE seconds."""
        try:
            self.cluster.agents[spare].call(StatusRequest(self.cluster.record.run_id, {}), timeout=SPARE_PATIENCE)
        except HostError:
            return False
        return True

    def carry_out(self, plan: MovePlan) -> None:
        """Stop the tasks that restart, record the move, start the moved and restarted tasks as a
        run's tasks start. The lost host leaves the run; what it ran is stopped once it answers."""
        cluster, record = self.cluster, self.cluster.record

        def say(who: str, message: str) -> None:
            self.carry_out_action(Say(f"{who}: {message}" if who else message))

        for line in plan.announced():
            self.carry_out_action(line)
        if plan.restarted:
            cluster.stop_tasks([record.task(t.name) for t in plan.restarted])
        moves = plan.record_moves(self.clock.time())
        cluster.apply(self.store, transitions.record_move(plan.lost, plan.spare, plan.tasks, moves))
        cluster.leave(plan.lost)  # its lease renewed no more; the supervision asks it to stop what it ran
        starting = [t for t in plan.tasks if t in plan.moved or t in plan.restarted]
        again = f"moved{len(cluster.record.moves)}"  # what the restarted tasks left: set aside
        names = [t.name for t in starting]
        self.restarting.before(names)
        try:
            control.start(cluster, start_phases(starting, "together"), record.startup_timeout, say, again=again)
        finally:  # started or failed, what they printed is theirs to show
            self.restarting.after(names)
        for event in plan.told():
            self.carry_out_action(event)
