"""The `metrics:` mapping: what a run's result is read from (`tf/results.py`).

Each name maps to a regex over one output line: the value is the group named as the metric,
`value`, or the first group; an optional `step` group says the step it came at. Hosts search
their logs with every regex as bytes, so each must compile as text and as bytes.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

from tfctl.config.base import INVALID, Doc, type_error

EXAMPLE = r'metrics: {accuracy: "test accuracy (?P<accuracy>[0-9.]+) at step (?P<step>\d+)"}'
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*")


def _metrics(doc: Doc, path: str, value: Any) -> Any:
    """Name -> a regex with a group for the value; refused whole where one is wrong."""
    if not isinstance(value, dict) or not value:
        return type_error(doc, path, "a mapping of metric names to regexes", value, f"e.g. `{EXAMPLE}`")
    valid = True
    for name, pattern in value.items():
        child = f"{path}.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            doc.problem(child, f"`{name}` is not a metric name", "use letters, digits, `_`, `.`, `/` or `-`")
            valid = False
        elif not isinstance(pattern, str) or not pattern:
            type_error(doc, child, "a regex string", pattern, f"e.g. `{EXAMPLE}`")
            valid = False
        elif (problem := _pattern_problem(name, pattern)) is not None:
            doc.problem(child, problem, f"e.g. `{EXAMPLE}`")
            valid = False
    return MappingProxyType(dict(value)) if valid else INVALID


def _pattern_problem(name: str, pattern: str) -> str | None:
    try:
        regex = re.compile(pattern)
        re.compile(pattern.encode("utf-8"))
    except (re.error, ValueError) as e:
        return f"is not a valid regular expression: {e}"
    if "(?P=" in pattern or re.search(r"\\[1-9]", pattern):
        return "uses a backreference: hosts search every metric's regex as one, so groups cannot refer back"
    steps = {regex.groupindex["step"]} if "step" in regex.groupindex else set()
    if name not in regex.groupindex and "value" not in regex.groupindex and regex.groups <= len(steps):
        return f"has no group for the value: write `(?P<{name}>...)`, `(?P<value>...)` or a plain `(...)`"
    return None
