"""A cluster file's `params:`: named values its other keys use as `{params.NAME}`, overridden
from the command line (`up --set lr=0.01`). They are put in before any key is validated, so a
parameter may stand for a path, a count of GPUs or a host as well as for a flag's value: a value
that is a placeholder alone takes the parameter's type (`gpus: "{params.gpus}"` is a number),
one with text around it becomes text (shell-quoted in a command, as every placeholder there).
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Mapping, Sequence

import yaml

from tfctl.config.base import INVALID, Doc, type_error
from tfctl.errors import UsageError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PLACEHOLDER = re.compile(r"(?<!\{)\{params\.([^{}]*)\}(?!\})")  # (`{{params.x}}` is literal text)
KEY = "params"
# Keys that are shell commands: a parameter put into one is shell-quoted, as every placeholder
# there is (`--note={params.note}` with `two words` stays one argument).
SHELL = re.compile(r"(command|jobs\.[^.]+\.command|setup\[\d+\]|notify\[\d+\])")
# Keys whose text is filled per task (`{job_name}`, `{run_id}`): a parameter's braces put into one
# are doubled, so `--set note={run_id}` stays that text and is no placeholder.
TEMPLATED = re.compile(r"(command|jobs\.[^.]+\.command|env\..+|jobs\.[^.]+\.env\..+|logdir)")


def overrides(assignments: Sequence[str]) -> dict[str, Any]:
    """`--set NAME=VALUE` pairs: each VALUE read as a YAML scalar (`0.01` a number, `true` a
    boolean, `adam` text), as it would be read in the file."""
    found: dict[str, Any] = {}
    for assignment in assignments:
        name, equals, text = assignment.partition("=")
        if not equals or not NAME.fullmatch(name):
            raise UsageError(
                f"--set {assignment}: expected NAME=VALUE with NAME a parameter of `params:`",
                hint="e.g. --set lr=0.01 (quote a value with spaces: --set 'note=two words')",
            )
        try:
            value = yaml.safe_load(text) if text.strip() else text
        except yaml.YAMLError:
            value = text
        if not isinstance(value, (str, int, float, bool)) or value is None:
            value = text  # a list or mapping written on the command line stays the text typed
        found[name] = (value, text)
    return found


def put_in(doc: Doc, root: dict[str, Any], given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run's parameters (the file's, with `given` over them: NAME -> value, or NAME ->
    (value, text as typed) from `overrides`), each `{params.NAME}` in `root` replaced by its
    value, and `root["params"]` set to them. A placeholder of no parameter, or a `--set` of one
    the file does not declare, is a problem naming the key."""
    declared = _declared(doc, root.get(KEY, {}))
    params = {name: value for name, (value, _text) in declared.items()}
    texts = {name: text for name, (_value, text) in declared.items()}
    for name, value in (given or {}).items():
        typed = isinstance(value, tuple)  # (from `overrides`: a value read from the text typed)
        value, text = value if typed else (value, text_of(value))
        if name not in declared:
            known = ", ".join(declared) or "none"
            doc.problem(
                KEY,
                f"--set {name}: no parameter `{name}` in `params:` (it has {known})",
                f"declare it with a default: `params: {{{name}: {text}}}`, or fix the name",
                at=doc.nodes.get(KEY, doc.nodes.get("")),
            )
            continue
        default = declared[name][0]
        if typed and isinstance(default, str):
            value = text  # a text parameter given `2.10` on the command line stays that text
        if typed or (value, type(value)) != (default, type(default)):  # (the default given as a value keeps its text)
            params[name], texts[name] = value, text
    for key in list(root):
        if key != KEY:
            root[key] = _substituted(doc, root[key], key, params, texts)
    root[KEY] = params
    doc.param_texts = texts
    return params


def _declared(doc: Doc, value: Any) -> dict[str, tuple[Any, str]]:
    if value is INVALID:
        return {}
    if not isinstance(value, dict):
        type_error(doc, KEY, "a mapping of names to values", value, "write e.g. `params: {lr: 0.01, batch: 64}`")
        return {}
    found: dict[str, tuple[Any, str]] = {}
    for name, default in value.items():
        path = f"{KEY}.{name}"
        if not NAME.fullmatch(name):
            doc.problem(path, f"`{name}` is not a parameter name", "use letters, digits and `_`, e.g. `learning_rate`")
        elif isinstance(default, (str, int, float, bool)) and default is not INVALID:
            found[name] = (default, default if isinstance(default, str) else doc.raw(path) or text_of(default))
        else:
            type_error(doc, path, "a number, a string or a boolean", default, f"write e.g. `{name}: 0.01`")
    return found


def _substituted(doc: Doc, value: Any, path: str, params: Mapping[str, Any], texts: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _substituted(doc, v, f"{path}.{k}", params, texts) for k, v in value.items()}
    if isinstance(value, list):
        return [_substituted(doc, v, f"{path}[{i}]", params, texts) for i, v in enumerate(value)]
    if not isinstance(value, str) or "{params." not in value:
        return value
    unknown = [name for name in PLACEHOLDER.findall(value) if name not in params]
    if unknown:
        known = ", ".join(params) or "none: the file has no `params:`"
        return doc.problem(
            path,
            f"`{{params.{unknown[0]}}}` names no parameter (declared: {known})",
            f"declare it: `params: {{{unknown[0]}: ...}}`, or fix the name",
        )
    templated = TEMPLATED.fullmatch(path) is not None
    whole = PLACEHOLDER.fullmatch(value)
    if whole:
        name = whole.group(1)
        doc.substituted[path] = texts[name]
        return _braces_doubled(params[name]) if templated and isinstance(params[name], str) else params[name]
    quoted = shlex.quote if SHELL.fullmatch(path) else str
    text = PLACEHOLDER.sub(
        lambda m: _braces_doubled(quoted(texts[m.group(1)])) if templated else quoted(texts[m.group(1)]), value
    )
    doc.substituted[path] = text
    return text


def _braces_doubled(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def text_of(value: Any) -> str:
    """A parameter's value as `--set` would type it (`true`, `0.01`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
