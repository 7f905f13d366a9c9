"""The cluster file: read YAML, validate it strictly, and build the `ClusterConfig` tfctl runs from.

Everything a run needs is derived from one `ClusterConfig` (see `model.py`); nothing downstream
re-reads YAML. `load_config`/`parse_config` report every problem at once, each with file, line,
column, key path and a fix, as one `ConfigError`. The per-key validators are in `fields.py`.
"""

from __future__ import annotations

import string
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import yaml

from tfctl.config import bounded, pool_keys, tracking_keys
from tfctl.config.fields import COMMAND_EXAMPLE, INVALID, PORT, REQUIRED, Doc, top_keys, type_error, unknown_key
from tfctl.config.model import JOB_NAMES, ClusterConfig
from tfctl.config.params import put_in
from tfctl.config.sweep_keys import check_names
from tfctl.errors import ConfigError, ConfigProblem
from tfctl.registry import backends

# --- Parsing ----------------------------------------------------------------------------------
#
# PyYAML's loader drops positions and silently keeps the last of duplicate keys, so we compose
# nodes ourselves: every value is converted with its key path ("jobs.worker[1]") remembered, and
# validators report problems against that path's node. Problems are collected, never raised one
# by one, so a user fixes a file in one pass.

_MERGE_TAG = "tag:yaml.org,2002:merge"
_PLAIN_TAGS: dict[type[yaml.Node], str] = {
    yaml.SequenceNode: "tag:yaml.org,2002:seq",
    yaml.MappingNode: "tag:yaml.org,2002:map",
}


MAX_ENV_VARIABLE = 128 * 1024  # bytes of `NAME=value`, with its NUL (Linux's MAX_ARG_STRLEN)
_NOT_A_CLUSTER_FILE = "check that -f names the cluster file (a few KiB of settings)"


def load_config(path: Path, params: Mapping[str, Any] | None = None) -> ClusterConfig:
    """Read and validate a cluster file (with `params` over its `params:`, as `params.put_in`
    takes them); an unreadable file is reported like any other mistake."""
    try:
        head = bounded.read_head(path)
        if len(head) > bounded.MAX_FILE:
            raise ConfigError([ConfigProblem(path, None, None, "", bounded.too_big_text(), _NOT_A_CLUSTER_FILE)])
        text = head.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as read_text() reads it
    except FileNotFoundError:
        problem = ConfigProblem(
            path, None, None, "", "no such cluster file", "create one with `tfctl init`, or pass -f FILE"
        )
    except IsADirectoryError:
        problem = ConfigProblem(
            path, None, None, "", "is a directory, not a cluster file", "pass the cluster file itself with -f FILE"
        )
    except UnicodeDecodeError as error:
        problem = ConfigProblem(
            path, None, None, "", f"is not UTF-8 text (bad byte at offset {error.start})", "save the file as UTF-8"
        )
    except OSError as error:
        problem = ConfigProblem(
            path, None, None, "", f"cannot be read: {error.strerror}", "make it readable (chmod u+r), or pass -f FILE"
        )
    else:
        return parse_config(text, path, params)
    raise ConfigError([problem])


def parse_config(text: str, path: Path, params: Mapping[str, Any] | None = None) -> ClusterConfig:
    """Validate cluster-file `text`; `path` locates problems and anchors a relative `workdir`;
    `params` (NAME -> value) override the file's `params:` before its placeholders are put in.

    Raises ConfigError carrying every problem found, in file order.
    """
    doc = Doc(path)
    root = compose(doc, text)
    if root is not INVALID:
        put_in(doc, root, params)
    config = None if root is INVALID else _build(doc, root)
    if doc.problems or config is None:
        doc.problems.sort(key=lambda p: (p.line is None, p.line or 0, p.column or 0))
        raise ConfigError(doc.problems)
    return replace(config, source=text, param_texts=MappingProxyType(doc.param_texts))


def compose(doc: Doc, text: str) -> Any:
    """YAML text -> plain Python values (top-level mapping), recording each path's node."""
    try:
        root = yaml.compose(text, Loader=bounded.BoundedLoader)
    except bounded.TooBig as error:
        return doc.problem("", error.problem or "", error.fix, at=error.problem_mark)
    except yaml.MarkedYAMLError as error:
        message = f"invalid YAML: {error.problem or error.context}"
        if error.context and error.problem and error.context_mark is not None:
            message += f" ({error.context} at line {error.context_mark.line + 1})"
        return doc.problem("", message, _yaml_fix(error), at=error.problem_mark or error.context_mark)
    except yaml.reader.ReaderError as error:
        line = text.count("\n", 0, error.position)
        column = error.position - (text.rfind("\n", 0, error.position) + 1)
        mark = yaml.Mark("", error.position, line, column, None, 0)
        return doc.problem(
            "", f"invalid YAML: {error.reason} (character {error.character!r})", "delete the control character", at=mark
        )
    if root is None:
        return doc.problem(
            "",
            "the file is empty",
            "start from `tfctl init`, or write at least `name`, `command` and `jobs`",
            at=yaml.Mark("", 0, 0, 0, None, 0),
        )
    value = _convert(doc, root, "", frozenset())
    if value is not INVALID and not isinstance(value, dict):
        return type_error(
            doc,
            "",
            "a mapping of settings (`name: ...`, `jobs: ...`)",
            value,
            "write the file as `key: value` lines, starting with `name:`",
        )
    return value


def _yaml_fix(error: yaml.MarkedYAMLError) -> str:
    """The usual causes of a YAML syntax error, in the order people hit them."""
    said = f"{error.context} {error.problem}"
    if "'\\t'" in said:
        return "indent with spaces; YAML does not allow tabs"
    if "single document" in said:
        return "keep one YAML document per cluster file: remove the extra `---`"
    return (
        "check the indentation, and quote values that contain `: ` or ` #`"
        ' or start with `[`, `{`, `*`, `&` (e.g. `"[::1]:2222"`)'
    )


def _convert(doc: Doc, node: yaml.Node, path: str, active: frozenset[int]) -> Any:
    """One node -> a Python value; `active` holds the collections being converted, to stop alias cycles."""
    doc.nodes[path] = node
    if isinstance(node, yaml.ScalarNode):
        try:
            return doc.scalars.construct_object(node)
        except (yaml.constructor.ConstructorError, ValueError):
            return doc.problem(
                path, f"cannot read a value tagged `{node.tag}`", "remove the `!` tag; tfctl reads plain YAML values"
            )
    if id(node) in active:
        return doc.problem(
            path, "a YAML alias refers to the value containing it", "replace the `*alias` with the value written out"
        )
    if node.tag != _PLAIN_TAGS[type(node)]:
        return doc.problem(
            path, f"unsupported YAML tag `{node.tag}`", "remove the `!` tag; tfctl reads plain YAML values"
        )
    active = active | {id(node)}
    if isinstance(node, yaml.SequenceNode):
        return [_convert(doc, item, f"{path}[{index}]", active) for index, item in enumerate(node.value)]
    result: dict[str, Any] = {}
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE_TAG:
            doc.problem(
                path, "YAML merge keys (`<<`) are not supported", "write the merged keys out in full", at=key_node
            )
            continue
        if not isinstance(key_node, yaml.ScalarNode):
            doc.problem(
                path,
                "a key must be a plain name, found a list or mapping",
                "write the key as a plain name",
                at=key_node,
            )
            continue
        key = key_node.value  # as written: `yes:` or `1:` stay names, not True or 1
        child = f"{path}.{key}" if path else key
        if key in result:
            first = doc.key_nodes[child].start_mark.line + 1
            doc.problem(
                child,
                f"duplicate key `{key}` (first at line {first})",
                "remove one of them; YAML would silently keep only the last",
                at=key_node,
            )
            continue
        doc.key_nodes[child] = key_node
        result[key] = _convert(doc, value_node, child, active)
    return result


def _build(doc: Doc, root: dict[str, Any]) -> ClusterConfig | None:
    """Validate every top-level key, then the checks that span keys."""
    values: dict[str, Any] = {}
    known = top_keys()
    for key, value in root.items():
        validator = known.get(key)
        if key in JOB_NAMES:
            doc.problem(
                key,
                f"`{key}` is a job, not a top-level key",
                f"move it under `jobs:`, e.g. `jobs: {{{key}: [localhost:{PORT}]}}`",
                at=doc.key_nodes[key],
            )
        elif validator is None:
            unknown_key(doc, key, key, "key", tuple(known))
        elif value is not INVALID:
            values[key] = validator(doc, key, value)
    for key, fix in REQUIRED.items():
        if key not in root:
            doc.problem(key, f"missing required key `{key}`", fix, at=doc.nodes[""])
    _check_commands(doc, root)
    _check_backend(doc, root, values)
    _check_logdir(doc, values)
    _check_env_sizes(doc, values)
    _check_device_env(doc, values)
    _check_host_names(doc, values, root)
    _check_on_stall(doc, values)
    tracking_keys.check_env(doc, values)
    check_names(doc, values.get("sweep"), values.get("params"))
    pool_keys.check(doc, root)
    if doc.problems:
        return None
    return ClusterConfig(path=doc.file, **values)


def _check_on_stall(doc: Doc, values: dict[str, Any]) -> None:
    """`on_stall: restart` counts each restart against the stalled job's own `max_restarts`:
    the jobs that train (and so can stall) need a restart policy."""
    progress, jobs = values.get("progress"), values.get("jobs")
    if progress is INVALID or progress is None or progress.on_stall != "restart" or not isinstance(jobs, Mapping):
        return
    bare = [
        n for n in ("chief", "worker") if n in jobs and (jobs[n].restart is None or jobs[n].restart.policy == "never")
    ]
    if bare:
        doc.problem(
            "progress.on_stall",
            f"`restart` restarts a stalled job's tasks within its restart policy, and {', '.join(bare)} has none",
            f"give {bare[0]} one, e.g. `restart: {{policy: on-failure, max_restarts: 3}}` under `jobs.{bare[0]}`, "
            "or use `on_stall: fail`",
        )


def _check_backend(doc: Doc, root: dict[str, Any], values: dict[str, Any]) -> None:
    """Every backend checks the keys it owns (a section of another backend's is a mistake it
    names); the chosen one's sections become `backend_settings`."""
    for name in backends.names():
        backends.settings(name).check(doc, root)
    sections = {key for name in backends.names() for key in backends.settings(name).SECTIONS}
    own = {key: values.pop(key) for key in sections if key in values}
    chosen = values.get("backend", backends.DEFAULT)
    if chosen in backends.names():
        values["backend_settings"] = backends.settings(chosen).settings(own)


def _check_commands(doc: Doc, root: dict[str, Any]) -> None:
    """A task without a command cannot start: name the jobs that have none."""
    jobs = root.get("jobs")
    if "command" in root or not isinstance(jobs, dict):
        return
    lacking = [
        name for name in JOB_NAMES if name in jobs and not (isinstance(jobs[name], dict) and "command" in jobs[name])
    ]
    if lacking:
        doc.problem(
            "command",
            f"missing: no top-level `command`, and these jobs have none of their own: {', '.join(lacking)}",
            f"add a top-level `{COMMAND_EXAMPLE}`, or a `command:` under each of those jobs",
            at=doc.nodes[""],
        )


def _check_logdir(doc: Doc, values: dict[str, Any]) -> None:
    """`{logdir}` in a command or an env value needs a `logdir` to fill it with."""
    if "logdir" in values:
        return
    jobs = values.get("jobs")
    commands = {"command": values.get("command")}
    if isinstance(values.get("env"), Mapping):
        commands.update({f"env.{name}": text for name, text in values["env"].items()})
    if isinstance(jobs, Mapping):
        commands.update({f"jobs.{name}.command": job.command for name, job in jobs.items()})
        commands.update({f"jobs.{name}.env.{key}": text for name, job in jobs.items() for key, text in job.env.items()})
    for path, command in commands.items():
        if isinstance(command, str) and "logdir" in {f[1] for f in string.Formatter().parse(command)}:
            doc.problem(
                path,
                "uses `{logdir}`, but the file has no `logdir`",
                "add a top-level `logdir: logs/{run_id}` (relative paths start at each task's workdir)",
            )


def _check_env_sizes(doc: Doc, values: dict[str, Any]) -> None:
    """A variable longer than the kernel passes to a program (MAX_ARG_STRLEN: 128 KiB for
    `NAME=value`) would fail every task at start with "Argument list too long": refused here."""
    jobs = values.get("jobs")
    every = {f"env.{name}": (name, text) for name, text in _env_of(values.get("env"))}
    if isinstance(jobs, Mapping):
        every.update({f"jobs.{job}.env.{n}": (n, text) for job, spec in jobs.items() for n, text in _env_of(spec.env)})
    for path, (name, text) in every.items():
        size = len(f"{name}={text}".encode())
        if size >= MAX_ENV_VARIABLE:
            doc.problem(
                path,
                f"`{name}=...` is {size} bytes, over the {MAX_ENV_VARIABLE >> 10} KiB a program can be given one "
                "variable in",
                "pass big data in a file (its path in the variable), not in the variable itself",
            )


def _env_of(env: Any) -> list[tuple[str, str]]:
    return [(n, t) for n, t in env.items() if isinstance(t, str)] if isinstance(env, Mapping) else []


def _check_device_env(doc: Doc, values: dict[str, Any]) -> None:
    """A job placed on GPUs gets its CUDA_VISIBLE_DEVICES from tfctl; one in its env would undo that."""
    jobs = values.get("jobs")
    if not isinstance(jobs, Mapping):
        return
    placed = [name for name, job in jobs.items() if job.gpus is not None]
    for name in placed:
        if "CUDA_VISIBLE_DEVICES" in jobs[name].env:
            path = f"jobs.{name}.env.CUDA_VISIBLE_DEVICES"
            doc.problem(path, f"job `{name}` has `gpus`, so tfctl sets this", "remove it", at=doc.key_nodes[path])
    if placed and isinstance(values.get("env"), Mapping) and "CUDA_VISIBLE_DEVICES" in values["env"]:
        doc.problem(
            "env.CUDA_VISIBLE_DEVICES",
            f"tfctl sets it for the tasks of {', '.join(placed)}, which have `gpus`",
            "remove it; to hide the GPUs from a job, give it `gpus: 0`",
            at=doc.key_nodes["env.CUDA_VISIBLE_DEVICES"],
        )


def _check_host_names(doc: Doc, values: dict[str, Any], root: Mapping[str, Any]) -> None:
    """A `hosts:` entry no job (nor `spares:`) uses is almost always a typo of one that does."""
    jobs, hosts = values.get("jobs"), values.get("hosts")
    if not isinstance(jobs, Mapping) or not isinstance(hosts, Mapping):
        return
    listed = root.get("spares")
    spares = listed if isinstance(listed, list) else []
    used = tuple(sorted({a.host for job in jobs.values() for a in job.addresses} | {str(s) for s in spares}))
    for name in hosts:
        if name not in used:
            unknown_key(
                doc,
                f"hosts.{name}",
                name,
                "host",
                used,
                allowed_kind="hosts (those used in `jobs`)",
                full_list="the allowed ones are those `jobs` and `spares` name",
            )
