"""The ssh backend's cluster-file keys. Its `ssh:` and `hosts:` sections are the cluster file's
own (`tfctl.config.ssh_hosts`): every run's hosts are reached by them, whichever backend places
the tasks. Its own key is `spares:`, the hosts that take over a lost host's tasks
(`controller/live/spares.py`); only the file's own hosts can have spares, so another backend refuses it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tfctl.config.base import INVALID, Doc, Validator, _string, type_error
from tfctl.config.model import JOB_NAMES

DESCRIPTION = "`ssh` (the default) runs on the hosts listed under each job"
_EXAMPLE = "spares: [h4, h5]"


@dataclass(frozen=True)
class SSHBackendSettings:
    spares: tuple[str, ...] = ()  # in the order they are used


def _spares(doc: Doc, path: str, value: Any) -> Any:
    if not isinstance(value, list):
        return type_error(doc, path, "a list of host names", value, f"e.g. `{_EXAMPLE}`")
    names = [_string(doc, f"{path}[{i}]", item, _EXAMPLE) for i, item in enumerate(value)]
    if INVALID in names:
        return INVALID
    for i, name in enumerate(names):
        if any(c.isspace() for c in name) or name.count(":") == 1:
            return doc.problem(f"{path}[{i}]", f"{name!r} is not a host name", f"a host, no port: `{_EXAMPLE}`")
        if name in names[:i]:
            return doc.problem(f"{path}[{i}]", f"{name} is listed twice", "list each spare once")
    return tuple(names)


SECTIONS: dict[str, Validator] = {"spares": _spares}
JOB_KEYS: dict[str, Validator] = {}
# One line per key for the generated reference (see `tfctl.config.key_docs`).
KEY_DOCS: dict[str, str] = {
    "spares": "Hosts no job lists, kept idle: a lost host's tasks move to the first one left.",
}


def settings(sections: Mapping[str, Any]) -> SSHBackendSettings:
    """The run's `ClusterConfig.backend_settings`, from the validated sections."""
    spares = sections.get("spares")
    return SSHBackendSettings(spares if isinstance(spares, tuple) else ())


def check(doc: Doc, root: Mapping[str, Any]) -> None:
    """Spares are the file's own hosts kept idle: another backend has none, and a spare that
    already runs a task would take its tasks over from itself."""
    spares = root.get("spares")
    if spares is None:
        return
    backend = root.get("backend", "ssh")
    if backend not in (None, "ssh"):
        doc.problem("spares", f"is for the ssh backend: `backend: {backend}` has no spare hosts", "remove `spares:`")
        return
    jobs = root.get("jobs")
    if not isinstance(spares, list) or not isinstance(jobs, dict):
        return
    used = set()
    for name, spec in jobs.items():
        listed = spec.get("hosts") if isinstance(spec, dict) else spec
        if name in JOB_NAMES and isinstance(listed, list):
            used |= {str(a).rsplit(":", 1)[0].strip("[]") for a in listed}
    for i, spare in enumerate(spares):
        if spare in used:
            doc.problem(f"spares[{i}]", f"{spare} runs tasks already", "a spare is a host no job lists")
