"""`tfctl check`: what `up` would find out before starting anything, without starting anything."""

from __future__ import annotations

from dataclasses import dataclass

from tfctl.cluster.answers import HostInfo
from tfctl.cluster.cluster import Cluster, Progress
from tfctl.config.devices import gpu_hosts, place
from tfctl.config.model import CHOSEN_AT_START, host_port
from tfctl.controller.live.launch import version_warnings
from tfctl.controller.start.plan import Plan
from tfctl.controller.start.preflight import preflight, tensorboard_warnings
from tfctl.supervisor.protocol import PortInfo

LOG_DRAIN_SECONDS = 10.0


@dataclass(frozen=True)
class CheckReport:
    hosts: list[HostInfo]
    warnings: list[str]
    busy: dict[str, PortInfo]
    network: str | None  # the reachability summary, when checked


def check(plan: Plan, network: bool, progress: Progress, accept_new_host_keys: bool = False) -> CheckReport:
    """What `up` would find out before starting anything, without starting anything.

    With `network`, the ports of the tasks others must reach (the ps, or every worker for
    all-reduce) are held open by throw-away listeners and probed from every other host.
    """
    with Cluster(plan.record, accept_new_host_keys=accept_new_host_keys) as cluster:
        asks = plan.config.device_asks()
        infos = preflight(cluster, plan.config, progress, gpu_hosts(asks))
        place(asks, {i.host: i.devices for i in infos})  # raises if tasks ask a host for more than it has
        busy = cluster.busy_ports([t for t in plan.record.tasks if t.port != CHOSEN_AT_START])
        summary = None
        if network and not busy:
            summary = _check_network(cluster, plan)
        return CheckReport(infos, version_warnings(infos) + tensorboard_warnings(plan.config, infos), busy, summary)


def _check_network(cluster: Cluster, plan: Plan) -> str:
    """Tasks written without a port are probed on ports their hosts pick, as `up` would."""
    targets = [cluster.record.task(name) for phase in plan.phases if phase.probe for name in phase.wait_listening]
    marker = cluster.record.run_id
    by_host: dict[str, list[int]] = {}
    unported: dict[str, list[int]] = {}
    for t in targets:
        (unported if t.port == CHOSEN_AT_START else by_host).setdefault(t.host, []).append(t.port)
    messages: list[str] = []
    try:
        picked = cluster.pick_ports({h: (len(p), by_host.get(h, [])) for h, p in unported.items()}, 120)
        cluster.hold_ports(by_host, marker, seconds=120)
        addresses = [t.address for t in targets if t.port != CHOSEN_AT_START]
        addresses += [host_port(h, port) for h, ports in picked.items() for port in ports]
        cluster.check_reachable(
            sorted({t.host for t in cluster.record.tasks}), addresses, lambda _who, msg: messages.append(msg)
        )
    finally:
        cluster.release_ports({*by_host, *unported}, marker)
    return messages[-1] if messages else "nothing to check"
