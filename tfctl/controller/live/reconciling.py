"""A live run's reconciler wired to the run: its rules (TensorFlow's judges from `tf/`, the
restart limits of its tasks), the looks the engine asks for (the judges' closer look, the
backend's word on the allocation), and the engine's actions carried out (a record transition,
a line, a `notify:` event, tasks restarted by their monitors, a left host struck off)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Hashable

from tfctl.backends.base import backend_for
from tfctl.cluster.cluster import Cluster
from tfctl.controller.live.notify import Notifier
from tfctl.engine.reconcile import Action, NoteSilence, Notify, RestartTasks, Rules, Say, StrikeOff
from tfctl.runs import transitions
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RestartRequest

if TYPE_CHECKING:
    from tfctl.cluster.control import CloserLook
    from tfctl.tf.judges import Sight
    from tfctl.tf.progress import RunProgress


def rules_of(cluster: Cluster, progress: RunProgress) -> Rules[Sight]:
    """The run's rules as its record says: its policy, its patience, its judges."""
    from tfctl.tf.judges import run_judges

    record = cluster.record
    limits = {t.name: t.restart.max_restarts for t in record.tasks if t.restart is not None}
    return Rules(record.decisive, record.essential, record.host_timeout, limits, run_judges(record, progress))


def closer_look(cluster: Cluster, progress: RunProgress) -> CloserLook:
    """The look the judges read: states, progress and tails in one request, the lines counted in
    it too when a judge wants them (`COUNTED`), and the connections a judge wants tried."""
    from tfctl.tf.doctor import TAIL_LINES, known_peers
    from tfctl.tf.judges import COUNTED, Probe, Sight

    def look(wants: frozenset[Hashable]) -> tuple[list, dict[str, Exception], object]:
        counted = COUNTED in wants
        looked, unreachable = cluster.status(progress=progress.rule(), tail=TAIL_LINES, count_lines=counted)
        probes = {w: cluster.reachable(w.source, w.address) for w in wants if isinstance(w, Probe)}
        sight = Sight(
            looked, progress.assess(looked), known_peers(cluster, looked), looked if counted else None, probes
        )
        return looked, unreachable, sight

    return look


def allocation_end(cluster: Cluster) -> Callable[[], str | None]:
    """The backend's words for the end of the run's allocation (None while it holds)."""
    backend = backend_for(cluster.record.backend)
    return lambda: backend.allocation_end(cluster.record)


def carrier(store: RunStore, cluster: Cluster, notifier: Notifier) -> Callable[[Action], None]:
    """The engine's actions, done: the silent hosts recorded for `status`, lines said, events
    told to the `notify:` commands, tasks restarted by their monitors (on the hosts that answer;
    a silent host's are judged as it is)."""

    def carry_out(action: Action) -> None:
        if isinstance(action, NoteSilence):
            cluster.apply(store, transitions.note_unreachable(dict(action.since)))
        elif isinstance(action, StrikeOff):
            cluster.apply(store, transitions.retire_host(action.host))
        elif isinstance(action, Say):
            notifier.say(action.text)
        elif isinstance(action, Notify):
            notifier.tell(cluster.record, action)
        elif isinstance(action, RestartTasks):
            grouped = cluster.by_host(action.tasks)
            run_id = cluster.record.run_id
            cluster.fan_out(
                grouped, lambda a: a.call(RestartRequest(run_id, [t.name for t in grouped[a.host]], action.why))
            )

    return carry_out
