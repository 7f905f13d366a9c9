"""A TensorFlow finding, explained with what tfctl knows about the other tasks of the run.

`diagnose.py` reads a task's log lines into findings; here each finding is cross-checked with
its peers' states, exit codes, listening ports and reachability, to say which explanation holds
(the ps is not up yet, it died, the name resolves elsewhere, device filters are missing ...).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Mapping

from tfctl.config.model import host_port
from tfctl.engine.observed import describe_end
from tfctl.supervisor.protocol import TaskState
from tfctl.tf.diagnose import DEVICE_FILTERS_FIX, Finding, Kind

if TYPE_CHECKING:
    from tfctl.engine.observed import TaskStatus

Reachable = Callable[[str, str], "bool | None"]  # (source host, "host:port") -> True/False/None (unknown)


@dataclass(frozen=True)
class PeerInfo:
    """What tfctl knows about one task of the run (see `from_status`)."""

    task: str
    host: str
    port: int
    state: TaskState = TaskState.UNREACHABLE
    exit_code: int | None = None
    signal: int | None = None
    ended_at: float | None = None  # epoch seconds
    listening: bool = False
    error: str | None = None  # why it could not start, when the supervisor knows
    trains: bool = False  # its recent output shows training steps, or TF's lines its session up

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)

    @classmethod
    def from_status(cls, status: TaskStatus, ended_at: float | None = None) -> PeerInfo:
        """From the controller's TaskStatus; `ended_at` stands in when the status has none."""
        return cls(
            status.task,
            status.host,
            status.port,
            status.state,
            status.exit_code,
            status.signal,
            status.ended_at if ended_at is None else ended_at,
            status.listening,
            status.error,
            bool(status.marks),
        )


def _ended(p: PeerInfo) -> str:
    """`ps:0 exited with code 1 at 18:44:03`."""
    return f"{p.task} {describe_end(p.state, p.exit_code, p.signal, p.error, p.ended_at)}"


def _job(task: str | None) -> str:
    return (task or "").split(":")[0]


def explain(finding: Finding, peers: Mapping[str, PeerInfo], reachable: Reachable) -> Finding:
    """Cross-check a finding with what tfctl knows; returns it with a cause/fix saying which case holds.

    `peers` maps task name -> PeerInfo for every task of the run (the waiting task included, for
    its host). `reachable(src_host, "host:port")` is only called for a peer that runs and
    listens. Findings of other kinds, or naming no peer tfctl can judge, come back unchanged.
    """
    if finding.kind in (Kind.WAITING_FOR_PEER, Kind.MWMS_WAITING):
        return _explain_wait(finding, peers, reachable)
    if finding.kind is Kind.WAITING_FOR_MODEL:
        return _explain_model(finding, peers)
    if finding.kind in (Kind.PEER_DIED, Kind.STEP_CANCELLED):
        return _explain_death(finding, peers)
    return finding


def is_news(finding: Finding, peers: Mapping[str, PeerInfo]) -> bool:
    """Whether a finding is worth telling. A connection lost to a peer that finished
    successfully (a synchronous worker done before the chief) is how a job ends, not news."""
    if finding.kind in (Kind.PEER_DIED, Kind.STEP_CANCELLED) and finding.peer is not None:
        peer = peers.get(finding.peer)
        return peer is None or peer.state is not TaskState.SUCCEEDED
    return True


def _explain_wait(f: Finding, peers: Mapping[str, PeerInfo], reachable: Reachable) -> Finding:
    name = f.peer
    if name is None:
        return f
    mwms = f.kind is Kind.MWMS_WAITING
    waits = "MultiWorkerMirroredStrategy waits for" if mwms else "CreateSession waits for"
    no_filters = not mwms and _job(f.task) in ("worker", "chief") and _job(name) in ("worker", "chief")
    p = peers.get(name)
    if p is None:
        known = ", ".join(sorted(peers)) or "none"
        return replace(
            f,
            cause=f"{waits} {name}, which is not a task of this cluster (it has {known}): the task's "
            "own cluster spec or task index disagrees with the cluster file",
            fix="build the cluster from TF_CONFIG (tfctl sets it) or from the {ps_hosts}/{worker_hosts} "
            "and {task_index} placeholders; check --task_index",
        )
    if p.state is TaskState.PENDING:
        cause, fix = (
            f"{waits} {name} ({p.address}), which has never started (pending)",
            f"tfctl has not started {name} yet: if it stays pending, see `tfctl status` (its host "
            f"{p.host} may be unreachable)",
        )
    elif p.state is TaskState.STARTING:
        cause, fix = (
            f"{waits} {name} ({p.address}), which is still starting on {p.host}",
            "wait a few seconds; if it stays so, see `tfctl status`",
        )
    elif p.state is TaskState.UNREACHABLE:
        cause, fix = (
            f"{waits} {name} ({p.address}), whose state is unknown: its host {p.host} is unreachable",
            f"check the connection to {p.host}",
        )
    elif p.state.is_final:
        cause = f"{waits} {name} ({p.address}), but {_ended(p)}"
        if p.state is TaskState.SUCCEEDED and not mwms and _job(name) != "ps":
            cause += ": a session without device filters waits for every task, finished ones too"
            fix = DEVICE_FILTERS_FIX
        elif mwms:
            fix = f"MultiWorkerMirroredStrategy needs every worker: see `tfctl logs {name}`, then restart the run"
        else:
            fix = f"see why in `tfctl logs {name}`, then restart the run (`tfctl down`, `tfctl up`)"
    elif not p.listening:
        cause = f"{waits} {name}, which is running but does not listen on {p.address} yet"
        fix = (
            f"wait for its `Started server with target: grpc://...:{p.port}` line (`tfctl logs {name}`); if it "
            f"never comes, {name} does not start a TensorFlow server on port {p.port}"
        )
    else:
        waiter = peers.get(f.task)
        ok = reachable(waiter.host, p.address) if waiter is not None else None
        src = waiter.host if waiter is not None else "the waiting task's host"
        if ok is False:
            cause = (
                f"{name} is running and listens on {p.address}, but {p.address} is NOT reachable from {src} "
                f"(the host of {f.task}): a firewall, or that name means another address there"
            )
            fix = (
                f"on {src} try `nc -vz {p.host} {p.port}`; open port {p.port} or use an address {src} can "
                "reach in the cluster file"
            )
        elif ok is None:
            cause = f"{name} is running and listens on {p.address}; whether {src} can reach it is unknown"
            fix = f"on {src} try `nc -vz {p.host} {p.port}`; if that connects, " + (
                "check the TF_CONFIG of every task" if mwms else DEVICE_FILTERS_FIX
            )
        elif mwms:
            cause = (
                f"{name} is running and reachable at {p.address} from {src}, yet has not joined: its "
                "TF_CONFIG has another cluster or task index, or it has not created the strategy yet"
            )
            fix = (
                f"compare TF_CONFIG of {f.task} and {name}; {name}'s log should say `has connected to "
                "coordination service`"
            )
        else:
            cause = (
                f"{name} is running and reachable at {p.address} from {src}, so it is not what blocks: "
                "the session has no device filters and waits for every task, or its cluster spec has "
                f"another address for {name}"
            )
            fix = DEVICE_FILTERS_FIX
    if no_filters and p.state is not TaskState.SUCCEEDED and "device filters" not in cause:
        cause += "; and a worker never needs another worker: the session lacks device filters"
        fix = fix + "; and " + DEVICE_FILTERS_FIX
    return replace(f, cause=cause, fix=fix)


def _explain_model(f: Finding, peers: Mapping[str, PeerInfo]) -> Finding:
    chief = "chief:0" if "chief:0" in peers else "worker:0"
    p = peers.get(chief)
    if p is None:
        return f
    if chief == f.task:
        return replace(
            f,
            peer=chief,
            cause=f"{chief} is the chief, but it runs as a non-chief (is_chief=False): nothing will "
            "initialise the variables and every worker waits forever",
            fix="pass is_chief=(task_index == 0) (or job_name == 'chief') to MonitoredTrainingSession",
        )
    if p.trains and p.state in (TaskState.RUNNING, TaskState.SUCCEEDED):
        did = "trains" if p.state is TaskState.RUNNING else f"trained, then {_ended(p)}"
        cause = (
            f"the chief {chief} {did}, so it initialised its variables, yet the ones this worker reads "
            "are not: they live where the chief's init op never runs, typically on this worker's own "
            "task (a tf.device of /job:worker/task:N) instead of the ps; this worker waits forever"
        )
        fix = (
            "place them on a ps (tf.compat.v1.train.replica_device_setter(cluster=...)), or initialise them "
            "on this worker: a variable only it uses belongs in tf.compat.v1.local_variables, which each "
            "worker's local init op initialises"
        )
    elif p.state in (TaskState.PENDING, TaskState.STARTING):
        cause = f"the chief {chief} has not started yet ({p.state}); this worker looks again every 30 s"
        fix = f"nothing to do if {chief} starts soon; otherwise see `tfctl status`"
    elif p.state is TaskState.SUCCEEDED:
        cause = (
            f"{_ended(p)}, yet the variables are not initialised (the ps lost them, or this worker "
            "builds other variables): this worker waits forever"
        )
        fix = (
            "stop this task; start non-chiefs together with the chief, and build the same graph (same "
            "variable names) on every worker"
        )
    elif p.state.is_final:
        cause = f"{_ended(p)} before initialising the variables: nobody will, this worker waits forever"
        fix = f"see why in `tfctl logs {chief}`, then restart the run (`tfctl down`, `tfctl up`)"
    elif p.state is TaskState.UNREACHABLE:
        cause = f"the chief {chief}'s state is unknown: its host {p.host} is unreachable"
        fix = f"check the connection to {p.host}"
    else:
        cause = (
            f"the chief {chief} is running but has not initialised the variables yet: its log says why "
            "(often it waits at CreateSession itself)"
        )
        fix = f"read `tfctl logs {chief}` (and `tfctl status` for the ps tasks it needs)"
    return replace(f, peer=chief, cause=cause, fix=fix)


def _explain_death(f: Finding, peers: Mapping[str, PeerInfo]) -> Finding:
    if f.peer is not None:
        p = peers.get(f.peer)
        if p is None:
            return f
        if p.state.is_final:
            return replace(f, cause=f"lost the connection to {f.peer}: {_ended(p)}")
        if p.state is TaskState.RUNNING:
            return replace(
                f,
                cause=f"lost the connection to {f.peer}, which runs now (restarted, or the network "
                f"between {peers[f.task].host if f.task in peers else 'the hosts'} and "
                f"{p.host} failed for a while)",
            )
        return f
    ended = [
        p
        for name, p in sorted(peers.items())
        if name != f.task and p.state.is_final and p.state is not TaskState.SUCCEEDED
    ]
    ps = [p for p in ended if _job(p.task) == "ps"]
    culprits = ps or ended
    if not culprits:
        return f
    first = culprits[0]
    more = f" (and {len(culprits) - 1} more)" if len(culprits) > 1 else ""
    if f.kind is Kind.STEP_CANCELLED:
        return replace(
            f,
            peer=first.task,
            cause=f"a step was cancelled and {_ended(first)}{more}: this worker now hangs without an error",
            fix=f"see why in `tfctl logs {first.task}`, then restart the run (`tfctl down`, `tfctl up`)",
        )
    return replace(f, peer=first.task, cause=f"a connection failed (UNAVAILABLE) and {_ended(first)}{more}")
