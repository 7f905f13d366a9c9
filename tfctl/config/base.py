"""What every cluster-file validator is built from: the parse state problems are reported into,
and the validators of plain values (strings, durations, booleans, sections of known keys).

A validator takes (doc, key path, value) and returns the converted value, or INVALID after
recording a problem in `doc`. `config_fields.py` (the keys and jobs) and `config_hosts.py` (`ssh`
and `hosts`) build on these; the leading underscores say they are for those modules only.
"""

from __future__ import annotations

import difflib
import math
from datetime import date
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from tfctl.config.model import Address
from tfctl.errors import ConfigProblem

# Stands for a value whose problem is already recorded, so callers skip it instead of re-reporting.
INVALID: Any = object()


class Doc:
    """State of one parse: the file, each key path's YAML node (for positions), the problems."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.nodes: dict[str, yaml.Node] = {}
        self.key_nodes: dict[str, yaml.Node] = {}
        self.addresses: dict[Address, str] = {}  # first key path of each host:port, for duplicates
        self.problems: list[ConfigProblem] = []
        self.scalars = yaml.constructor.SafeConstructor()
        self.substituted: dict[str, str] = {}  # key path -> its text once `{params.NAME}` was put in
        self.param_texts: dict[str, str] = {}  # each parameter's value as written or typed (`0.010`)

    def problem(self, path: str, message: str, fix: str | None, *, at: yaml.Node | yaml.Mark | None = None) -> Any:
        """Record a problem located at `at` (a node or mark), else at the value of `path`; returns INVALID."""
        where = at if at is not None else self.nodes.get(path)
        mark = where.start_mark if isinstance(where, yaml.Node) else where
        line = mark.line + 1 if mark is not None else None
        column = mark.column + 1 if mark is not None else None
        self.problems.append(ConfigProblem(self.file, line, column, path, message, fix))
        return INVALID

    def raw(self, path: str) -> str | None:
        """The scalar text as written (`0.10`, not 0.1), for values that end up as strings."""
        if path in self.substituted:
            return self.substituted[path]
        node = self.nodes.get(path)
        return node.value if isinstance(node, yaml.ScalarNode) else None


# (doc, key path, value) -> converted value, or INVALID after recording a problem.
Validator = Callable[[Doc, str, Any], Any]


def _found(value: Any, raw: str | None) -> str:
    """What YAML made of a value, in the user's terms; `raw` is the text as written, if a scalar."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return f"a boolean (`{raw}`: YAML reads yes/no/on/off/true/false as booleans)"
    if isinstance(value, (int, float)):
        return f"a number ({raw})"
    if isinstance(value, str):
        return f"a string (`{value}`)" if len(value) <= 40 else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, date):
        return "a date"
    return f"a YAML {type(value).__name__}"


def type_error(doc: Doc, path: str, expected: str, value: Any, fix: str) -> Any:
    return doc.problem(path, f"expected {expected}, found {_found(value, doc.raw(path))}", fix)


def _leaf(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def _suggest(word: str, choices: tuple[str, ...], aliases: Mapping[str, str] | None = None) -> str | None:
    """Closest valid name: a known alias, a near spelling, or the one choice it abbreviates."""
    if aliases and word in aliases:
        return aliases[word]
    lowered = word.lower()
    close = difflib.get_close_matches(lowered, choices, n=1, cutoff=0.6)
    if close:
        return close[0]
    prefixed = [choice for choice in choices if lowered and (choice.startswith(lowered) or lowered.startswith(choice))]
    return prefixed[0] if len(prefixed) == 1 else None


# A list of allowed names this short is shown whole; a longer one only by its names near the
# mistake, and where it is written out in full.
SHOWN_WHOLE = 6
KEY_REFERENCE = "docs/reference/cluster-file.md"


def unknown_key(
    doc: Doc,
    path: str,
    key: str,
    kind: str,
    allowed: tuple[str, ...],
    aliases: Mapping[str, str] | None = None,
    allowed_kind: str | None = None,
    full_list: str = f"every one is listed in {KEY_REFERENCE}",
) -> Any:
    """`allowed_kind`: how the listing names what is allowed, when that is not `kind` + "s";
    `full_list`: where every allowed name is written out, for a list too long to repeat."""
    hint = _suggest(key, allowed, aliases)
    kinds = allowed_kind or kind + "s"
    if len(allowed) <= SHOWN_WHOLE:
        listing = f"allowed {kinds}: {', '.join(allowed)}"
    else:
        near = [c for c in difflib.get_close_matches(key.lower(), allowed, n=4, cutoff=0.6) if c != hint][:3]
        listing = (f"{'also near' if hint else 'near'}: {', '.join(near)}; " if near else "") + full_list
    fix = f"did you mean `{hint}`? {listing}" if hint else f"remove or rename it; {listing}"
    return doc.problem(path, f"unknown {kind} `{key}`", fix, at=doc.key_nodes.get(path))


def _string(doc: Doc, path: str, value: Any, example: str) -> Any:
    """A non-empty string; a number or boolean gets the fix to quote it."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, str):
        return doc.problem(path, "is empty", f"give a value, e.g. `{example}`")
    raw = doc.raw(path)
    if value is not None and raw is not None:
        fix = f'quote it so YAML keeps it as text: `{_leaf(path)}: "{raw}"`'
    else:
        fix = f"e.g. `{example}`"
    return type_error(doc, path, "a string", value, fix)


def _python(doc: Doc, path: str, value: Any) -> Any:
    return _string(doc, path, value, "python: python3")


def _seconds(default: float, zero_means: str | None = None) -> Validator:
    """Validator for a positive, finite duration in seconds; with `zero_means`, 0 is allowed too
    (and the hint says what it does)."""

    def validate(doc: Doc, path: str, value: Any) -> Any:
        example = f"`{path}: {default:g}`" + (f", or `{path}: 0` {zero_means}" if zero_means else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return type_error(doc, path, "a number of seconds", value, f"write a plain number, e.g. {example}")
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
        if not (0 <= seconds if zero_means else 0 < seconds) or seconds == math.inf:
            least = "0 or more" if zero_means else "greater than 0"
            return doc.problem(path, f"must be a number of seconds {least}, found {value}", f"e.g. {example}")
        return seconds

    return validate


def _choice(choices: tuple[str, ...], fix: str) -> Validator:
    """One of `choices`, spelled exactly; a near miss (another case, a typo) gets a `did you mean`."""

    def validate(doc: Doc, path: str, value: Any) -> Any:
        if isinstance(value, str) and value in choices:
            return value
        hint = None
        if isinstance(value, str):
            same = [choice for choice in choices if choice.lower() == value.lower()]
            hint = same[0] if same else _suggest(value, choices)
        guess = f"did you mean `{hint}`? " if hint else ""
        found = _found(value, doc.raw(path))
        return doc.problem(path, f"expected one of {', '.join(choices)}, found {found}", guess + fix)

    return validate


def _whole_number(what: str, least: int, example: str) -> Validator:
    """A whole number of `what`, at least `least`."""

    def validate(doc: Doc, path: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            found = _found(value, doc.raw(path))
            return doc.problem(path, f"must be a whole number of {what}, {least} or more, found {found}", example)
        return value

    return validate


def _boolean(doc: Doc, path: str, value: Any) -> Any:
    if isinstance(value, bool):
        return value
    return type_error(doc, path, "true or false", value, f"write `{_leaf(path)}: true` or `{_leaf(path)}: false`")


class Section:
    """Validator for a mapping of known keys, each with its own validator, built into `build`;
    a class, so the generated key reference can list the section's keys (`fields`)."""

    def __init__(
        self,
        fields: Mapping[str, Validator],
        build: Callable[..., Any],
        example: str,
        required: Mapping[str, str] | None = None,
    ) -> None:
        self.fields = fields
        self.build = build
        self.example = example
        self.required = required or {}  # key -> how to add it

    def __call__(self, doc: Doc, path: str, value: Any) -> Any:
        if not isinstance(value, dict):
            return type_error(doc, path, "a mapping", value, f"e.g. `{self.example}`")
        out, valid = {}, True
        for key, fix in self.required.items():
            if key not in value:
                doc.problem(f"{path}.{key}", f"missing required key `{key}`", fix, at=doc.nodes.get(path))
                valid = False
        for key, item in value.items():
            child = f"{path}.{key}"
            validator = self.fields.get(key)
            if validator is None:
                unknown_key(doc, child, key, "key", tuple(self.fields))
                valid = False
            elif item is INVALID:
                valid = False
            else:
                out[key] = validator(doc, child, item)
                valid = valid and out[key] is not INVALID
        return self.build(**out) if valid else INVALID
