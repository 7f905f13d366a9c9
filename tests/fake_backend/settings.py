"""The fake backend's cluster-file keys: a `fake:` section naming the pool its hosts come from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tfctl.config.base import Doc, Validator, _section, _string

DESCRIPTION = "`fake` on the tests' in-process hosts"


@dataclass(frozen=True)
class FakeSettings:
    pool: str = "default"


def _pool(doc: Doc, path: str, value: Any) -> Any:
    return _string(doc, path, value, "pool: default")


SECTIONS: dict[str, Validator] = {"fake": _section({"pool": _pool}, FakeSettings, "fake: {pool: default}")}
JOB_KEYS: dict[str, Validator] = {}


def settings(sections: Mapping[str, Any]) -> FakeSettings:
    section = sections.get("fake")
    return section if isinstance(section, FakeSettings) else FakeSettings()


def check(doc: Doc, root: Mapping[str, Any]) -> None:
    if "fake" in root and root.get("backend") != "fake":
        doc.problem("fake", "is set, but the backend is not fake", "add `backend: fake`, or remove the `fake:` section")
