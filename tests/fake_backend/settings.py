"""The fake backend's cluster-file keys: a `fake:` section naming the pool its hosts come from,
and which of them do not see this machine's files (the workdir is synced to those)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tfctl.config.base import INVALID, Doc, Section, Validator, _string, _whole_number, type_error

DESCRIPTION = "`fake` on the tests' in-process hosts"


@dataclass(frozen=True)
class FakeSettings:
    pool: str = "default"
    remote: tuple[str, ...] = ()  # hosts that do not share this machine's files
    spares: tuple[str, ...] = ()  # hosts that take over a lost host's tasks
    resubmit: int = 0  # new leases for a run whose lease ended by TIMEOUT or PREEMPTED


def _pool(doc: Doc, path: str, value: Any) -> Any:
    return _string(doc, path, value, "pool: default")


def _remote(doc: Doc, path: str, value: Any) -> Any:
    if not isinstance(value, list):
        return type_error(doc, path, "a list of host names", value, "e.g. `remote: [h2]`")
    names = [_string(doc, f"{path}[{i}]", item, "remote: [h2]") for i, item in enumerate(value)]
    return INVALID if INVALID in names else tuple(names)


SECTIONS: dict[str, Validator] = {
    "fake": Section(
        {"pool": _pool, "remote": _remote, "spares": _remote, "resubmit": _whole_number("resubmit", 0, "resubmit: 2")},
        FakeSettings,
        "fake: {pool: default}",
    )
}
JOB_KEYS: dict[str, Validator] = {}


def settings(sections: Mapping[str, Any]) -> FakeSettings:
    section = sections.get("fake")
    return section if isinstance(section, FakeSettings) else FakeSettings()


def check(doc: Doc, root: Mapping[str, Any]) -> None:
    if "fake" in root and root.get("backend") != "fake":
        doc.problem("fake", "is set, but the backend is not fake", "add `backend: fake`, or remove the `fake:` section")
