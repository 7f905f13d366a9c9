"""What a run's hosts answer, in the forms the verbs read: each host's facts from preflight, a
failed reachability probe in words, and what a stop did and could not prove gone."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from tfctl.config.devices import HostDevices
from tfctl.supervisor import records
from tfctl.supervisor.protocol import ProbeResult
from tfctl.supervisor.records import Wire, record


def bin_dir(python: str) -> str | None:
    """The directory of the host's interpreter, when it is given as a path (a virtualenv's
    bin/python): first on the tasks' PATH, as activating the virtualenv would put it."""
    return posixpath.dirname(python) if "/" in python else None


PROBE_CAUSES = {
    "refused": "connection refused: nothing listens there as seen from this host "
    "(wrong address, or the name leads to another machine)",
    "timeout": "timed out: a firewall drops the traffic, or the host is down",
    "unresolvable": "the name does not resolve on this host: add it to DNS or /etc/hosts there, or use an IP",
    "unreachable": "no route to that address from this host",
}


@dataclass(frozen=True)
class ProbeFailure:
    """One connection that failed in a reachability check, with the likely cause in words."""

    source: str
    target: str
    result: ProbeResult

    def __str__(self) -> str:
        r = self.result
        why = PROBE_CAUSES.get(r.error or "", r.error or "failed")
        if r.local and r.error == "refused":
            why = (
                f"the name resolves to {r.address}, an address of {self.source} itself, "
                f"where nothing listens on that port"
            )
        extra = f" ({r.detail})" if r.detail else ""
        return f"{self.source} -> {self.target}: {why}{extra}"


@dataclass(frozen=True)
class HostInfo:
    host: str
    hostname: str
    python: str | None
    tensorflow: str | None
    error: str | None = None
    devices: HostDevices = field(default_factory=HostDevices)
    filesystem: str = ""  # the same on hosts that share a home (`supervisor.sync.filesystem_token`)
    python_executable: str = ""  # the interpreter the tasks' `python` resolved to
    container: str = ""  # the runtime and image it is in; "": bare on the host
    missing_modules: tuple[str, ...] = ()  # of those the tasks' scripts import, what it lacks


@record
class StopReport(Wire):
    """What `stop` did on every host, and what it could not prove gone. A live controller sends it
    to the `down` that asked it (`controller/live/rpc_messages.py`)."""

    processes: int = 0
    remaining: dict[str, list[int]] = records.field(default_factory=dict)  # host -> pids
    busy_ports: dict[str, list[int]] = records.field(default_factory=dict)  # host:port -> pids
    hosts: int = 0
    ports: list[int] = records.field(default_factory=list)
    unreachable: dict[str, str] = records.field(default_factory=dict)  # host -> why
    # Hosts the run left when their tasks moved to a spare, still silent: nothing of the run runs
    # there unless they come back, so they do not make the stop unclean (`render_stop` says so).
    lost_silent: dict[str, str] = records.field(default_factory=dict)  # host -> why
    containers: int = 0  # the run's containers when the stop began
    containers_left: dict[str, list[str]] = records.field(default_factory=dict)  # host -> names
    ended: int = 0  # the run's tasks that had already ended when the stop began

    @property
    def clean(self) -> bool:
        return not self.remaining and not self.busy_ports and not self.unreachable and not self.containers_left


def error_text(error: Exception) -> str:
    return str(getattr(error, "message", error))


LINE_SHOWN = 500  # characters of each line an error message quotes: a 4 MiB line would fill screens


def cut_line(line: str) -> str:
    return line if len(line) <= LINE_SHOWN else f"{line[:LINE_SHOWN]}… ({len(line) - LINE_SHOWN} more characters)"
