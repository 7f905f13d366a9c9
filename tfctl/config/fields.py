"""The cluster file's keys, one validator each (those of `ssh` and `hosts` in `ssh_hosts.py`).

A validator takes (doc, key path, value) and returns the converted value, or INVALID after
recording a problem in `doc` (`base.py`); `loader.py` reads the YAML and runs `TOP_KEYS`
over it.
"""

from __future__ import annotations

import ipaddress
import re
import string
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from tfctl.config import pool_keys
from tfctl.config.base import (
    INVALID,
    Doc,
    Section,
    Validator,
    _boolean,
    _choice,
    _leaf,
    _python,
    _seconds,
    _string,
    _suggest,
    _whole_number,
    type_error,
    unknown_key,
)
from tfctl.config.container import _container
from tfctl.config.kubernetes import _kubernetes
from tfctl.config.metrics import _metrics
from tfctl.config.model import (
    CHOSEN_AT_START,
    DEFAULT_BACKOFF,
    DEFAULT_GRACE_PERIOD,
    DEFAULT_HOST_TIMEOUT,
    DEFAULT_IDLE_PS_TIMEOUT,
    DEFAULT_LEASE_TIMEOUT,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_PROGRESS_WINDOW,
    DEFAULT_STALL_TIMEOUT,
    DEFAULT_STARTUP_TIMEOUT,
    ENV_PLACEHOLDERS,
    JOB_NAMES,
    LOGDIR_PLACEHOLDERS,
    PLACEHOLDERS,
    RESTART_POLICIES,
    STALL_ACTIONS,
    START_ORDERS,
    SUCCESS_POLICIES,
    Address,
    Job,
    ProgressSettings,
    RestartPolicy,
    frozen_env,
)
from tfctl.config.ssh_hosts import _hosts, _ssh
from tfctl.config.sweep_keys import _sweep
from tfctl.config.tracking_keys import tracking
from tfctl.registry import backends

RESERVED_ENV = ("TF_CONFIG", "TFCTL_RUN_ID", "TFCTL_TASK", "TFCTL_RUN_DIR")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
_DIGITS_RE = re.compile(r"[0-9]+")
PORT = 2222
COMMAND_EXAMPLE = "command: python train.py --job_name={job_name} --task_index={task_index}"
_PLACEHOLDER_LIST = ", ".join("{" + name + "}" for name in PLACEHOLDERS)
_ENV_PLACEHOLDER_LIST = ", ".join("{" + name + "}" for name in ENV_PLACEHOLDERS)
_BRACES_FIX = "write `{{` and `}}` for literal braces (e.g. `${{HOME}}` for the shell's ${HOME})"
_IPV6_FIX = 'write IPv6 in brackets and quoted, so YAML keeps them: `"[::1]:2222"`'
_JOB_ALIASES = {"master": "chief", "parameter_server": "ps", "parameter_servers": "ps"}
# Jobs TF runs as a single task; value: (most addresses allowed, fix).
_MAX_TASKS = {
    "chief": (1, "keep one address under `chief` and move the others to `worker`"),
    "evaluator": (1, "keep one address under `evaluator`; TF runs a single evaluator task"),
}


def _name(doc: Doc, path: str, value: Any) -> Any:
    name = _string(doc, path, value, "name: mnist")
    if name is INVALID or _NAME_RE.fullmatch(name):
        return name
    suggestion = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).lstrip("_.-")[:63] or "mnist"
    return doc.problem(
        path,
        f"`{name}` cannot be used: the name becomes part of run ids and directory names",
        f"use 1-63 letters, digits, `_`, `.` or `-`, starting with a letter or digit, e.g. `name: {suggestion}`",
    )


def _command(doc: Doc, path: str, value: Any) -> Any:
    """A command whose `{placeholders}` are all ones tfctl fills in, without format specs."""
    if isinstance(value, dict):
        return type_error(
            doc,
            path,
            "a command string",
            value,
            "quote the whole command: unquoted, a value starting with `{` is a YAML mapping",
        )
    command = _string(doc, path, value, COMMAND_EXAMPLE)
    if command is INVALID:
        return command
    return _placeholders(doc, path, command, PLACEHOLDERS, "task_index", f"placeholders are {_PLACEHOLDER_LIST}")


def _logdir(doc: Doc, path: str, value: Any) -> Any:
    """One directory for the whole run, so of the placeholders only `{run_id}` makes sense."""
    text = _string(doc, path, value, "logdir: logs/{run_id}")
    if text is INVALID:
        return text
    listing = "`logdir` is one directory for every task: its only placeholder is {run_id}"
    return _placeholders(doc, path, text, LOGDIR_PLACEHOLDERS, "run_id", listing)


def _placeholders(doc: Doc, path: str, text: str, allowed: tuple[str, ...], example: str, listing: str) -> Any:
    """`text` if each of its `{placeholders}` is in `allowed`, without format spec; else INVALID."""
    try:
        fields = [
            (name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(text) if name is not None
        ]
    except ValueError as error:
        return doc.problem(path, f"malformed braces: {error}", f"placeholders look like `{{{example}}}`; {_BRACES_FIX}")
    valid = True
    for name, spec, conversion in fields:
        shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        if name not in allowed:
            hint = _suggest(name, allowed)
            guess = f"did you mean `{{{hint}}}`? " if hint else ""
            doc.problem(path, f"unknown placeholder `{shown}`", f"{guess}{listing}; {_BRACES_FIX}")
            valid = False
        elif spec or conversion:
            doc.problem(
                path,
                f"placeholder `{shown}` has a format spec or conversion, which tfctl does not apply",
                f"write `{{{name}}}`",
            )
            valid = False
    return text if valid else INVALID


def _workdir(doc: Doc, path: str, value: Any) -> Any:
    """An existing directory; relative to the cluster file, so the file works from any cwd."""
    text = _string(doc, path, value, "workdir: .")
    if text is INVALID:
        return text
    directory = Path(text).expanduser()
    if not directory.is_absolute():
        directory = doc.file.parent / directory
    try:
        directory = directory.resolve()
    except (RuntimeError, OSError) as error:  # RuntimeError: a symlink loop
        return doc.problem(path, f"{directory} cannot be followed: {error}", "point `workdir` at a real directory")
    if not directory.exists():
        return doc.problem(
            path,
            f"directory {directory} does not exist",
            f"create it (mkdir -p {directory}) or fix the path; relative paths start at the cluster file's directory",
        )
    if not directory.is_dir():
        return doc.problem(
            path, f"{directory} is not a directory", "point `workdir` at the directory tasks should run in"
        )
    return directory


def _env(doc: Doc, path: str, value: Any) -> Any:
    """Variable name -> text, whose `{placeholders}` each task fills in; booleans are refused
    because YAML turns `yes` into true."""
    if not isinstance(value, dict):
        return type_error(
            doc, path, "a mapping of variable names to values", value, 'e.g. `env: {OMP_NUM_THREADS: "4"}`'
        )
    env: dict[str, str] = {}
    valid = True
    for key, item in value.items():
        child = f"{path}.{key}"
        if not _ENV_NAME_RE.fullmatch(key):
            doc.problem(
                child,
                f"`{key}` is not a valid environment variable name",
                "use letters, digits and `_`, not starting with a digit",
                at=doc.key_nodes[child],
            )
            valid = False
        elif key in RESERVED_ENV:
            doc.problem(
                child,
                f"`{key}` is set by tfctl for every task",
                f"remove it; tfctl derives {', '.join(RESERVED_ENV)} from the cluster file",
                at=doc.key_nodes[child],
            )
            valid = False
        if isinstance(item, str):
            listing = f"in `env`, placeholders are {_ENV_PLACEHOLDER_LIST}"
            if _placeholders(doc, child, item, ENV_PLACEHOLDERS, "task_index", listing) is INVALID:
                valid = False
            env[key] = item
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            env[key] = doc.raw(child) or str(item)  # as written: `0.10` stays "0.10"
        elif item is not INVALID:
            fix = (
                f'quote it: `{key}: "{doc.raw(child)}"`'
                if isinstance(item, bool)
                else f'quote it, e.g. `{key}: "value"` (`{key}: ""` for empty)'
            )
            type_error(doc, child, "a string or number", item, fix)
            valid = False
        else:
            valid = False
    return frozen_env(env) if valid else INVALID


def _jobs(doc: Doc, path: str, value: Any) -> Any:
    """Job name -> Job, in JOB_NAMES order whatever the file's order."""
    if not isinstance(value, dict):
        return type_error(
            doc,
            path,
            "a mapping of job name to addresses",
            value,
            f"e.g. `jobs: {{ps: [localhost:{PORT}], worker: [localhost:{PORT + 1}]}}`",
        )
    jobs: dict[str, Any] = {}
    for name, spec in value.items():
        child = f"{path}.{name}"
        if name not in JOB_NAMES:
            jobs[name] = unknown_key(doc, child, name, "job", JOB_NAMES, _JOB_ALIASES)
        else:
            jobs[name] = spec if spec is INVALID else _job(doc, child, name, spec)
    if set(value) <= set(JOB_NAMES) and not {"chief", "worker"} & set(value):
        doc.problem(
            path,
            "no `worker` or `chief` job, so nothing would train",
            f"add `worker: [localhost:{PORT + 1}]` under `jobs:`",
        )
    if any(job is INVALID for job in jobs.values()):
        return INVALID
    return MappingProxyType({name: jobs[name] for name in JOB_NAMES if name in jobs})


def _job(doc: Doc, path: str, name: str, spec: Any) -> Any:
    """A job is a list of addresses, or a mapping with `hosts` and optional `command`/`env`."""
    if isinstance(spec, dict):
        hosts_path, raw_hosts = f"{path}.hosts", spec.get("hosts")
        fields = {}
        for key, value in spec.items():
            validator = job_keys().get(key)
            if validator is None:
                fields[key] = unknown_key(doc, f"{path}.{key}", key, "key", tuple(job_keys()))
            else:
                fields[key] = value if value is INVALID else validator(doc, f"{path}.{key}", value)
        if "hosts" not in spec and "count" not in spec:  # with `count`, its backend says what is wrong
            fields["hosts"] = doc.problem(
                hosts_path,
                "missing required key `hosts`",
                f"add `hosts: [localhost:{PORT}]` under `{path}`",
                at=doc.nodes[path],
            )
    else:
        hosts_path, raw_hosts = path, spec
        fields = {"hosts": _addresses(doc, path, spec)}
    if name in _MAX_TASKS and isinstance(raw_hosts, list) and len(raw_hosts) > _MAX_TASKS[name][0]:
        limit, fix = _MAX_TASKS[name]
        return doc.problem(
            f"{hosts_path}[{limit}]", f"a cluster has at most {limit} `{name}` task, found {len(raw_hosts)}", fix
        )
    count = fields.get("count")
    if name in _MAX_TASKS and isinstance(count, int) and count > _MAX_TASKS[name][0]:
        return doc.problem(f"{path}.count", f"a cluster has at most 1 `{name}` task, found {count}", "write `count: 1`")
    if any(value is INVALID for value in fields.values()):
        return INVALID
    return Job(
        name=name,
        addresses=fields.get("hosts", ()),
        command=fields.get("command"),
        env=fields.get("env", frozen_env()),
        restart=fields.get("restart"),
        gpus=fields.get("gpus"),
        cpus=fields.get("cpus"),
        count=fields.get("count"),
        port=fields.get("port"),
        container=fields.get("container"),
        own=next((fields[key] for key in backends.names() if key in fields), None),
    )


def _addresses(doc: Doc, path: str, value: Any) -> Any:
    """A non-empty list of `host:port` (or `host`: port chosen at `up`), each unused by any task
    seen so far."""
    label = _leaf(path)
    if not isinstance(value, list):
        raw = doc.raw(path)
        fix = (
            f"make it a list: `{label}: [{raw}]`"
            if isinstance(value, (str, int, float)) and raw
            else f"e.g. `{label}: [localhost:{PORT}, localhost:{PORT + 1}]`"
        )
        return type_error(doc, path, "a list of host:port strings", value, fix)
    if not value:
        return doc.problem(
            path, "has no addresses", f"add one, e.g. `{label}: [localhost:{PORT}]`, or remove `{label}`"
        )
    addresses = [_address(doc, f"{path}[{index}]", item) for index, item in enumerate(value)]
    return INVALID if any(a is INVALID for a in addresses) else tuple(addresses)


def _address(doc: Doc, path: str, item: Any) -> Any:
    if item is INVALID:
        return item
    if isinstance(item, (int, float)) and not isinstance(item, bool):
        item = doc.raw(path)  # `10:22` is 622 to YAML 1.1, `2222` a number: use what was written
    if not isinstance(item, str):
        fix = _IPV6_FIX if isinstance(item, list) else f"write it as `localhost:{PORT}`"
        return type_error(doc, path, "a host:port string", item, fix)
    try:
        address = _parse_address(item)
    except ValueError as error:
        message, fix = error.args
        return doc.problem(path, message, fix)
    first = doc.addresses.setdefault(address, path)
    if first != path and address.port != CHOSEN_AT_START:  # a host's tasks without ports get one each
        port = address.port + 1
        while Address(address.host, port) in doc.addresses and port < 65535:
            port += 1
        return doc.problem(
            path,
            f"duplicates {first} ({address})",
            f"give every task its own host:port, e.g. `{Address(address.host, port)}`",
        )
    return address


def _parse_address(text: str) -> Address:
    """`host:port` or `[ipv6]:port` -> Address, or just the host: its port is chosen at `up`;
    raises ValueError(message, fix)."""
    if _DIGITS_RE.fullmatch(text):
        raise ValueError(
            f"`{text}` is a bare number, not host:port",
            f"write `localhost:{text}` (or `HOST:{text}` for another machine)",
        )
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"`{text}` is not `[ipv6]:port`", _IPV6_FIX)
        if not _valid_ipv6(host):
            raise ValueError(f"`{host}` is not a valid IPv6 address", _IPV6_FIX)
        if not rest:
            return Address(host, CHOSEN_AT_START)
        port, right_form = rest[1:], f'`"[{host}]:{PORT}"`'
    else:
        if text.count(":") > 1:
            raise ValueError(f"`{text}` looks like an IPv6 address without brackets", _IPV6_FIX)
        host, colon, port = text.partition(":")
        if not colon and host:
            return Address(host, CHOSEN_AT_START) if _valid_host(host) else _bad_host(host)
        if not host:
            raise ValueError(f"`{text}` has no host", f"write `localhost:{port or PORT}`")
        if not _valid_host(host):
            _bad_host(host)
        right_form = f"`{host}:{PORT}`"
    fix = f"write {right_form}, with a port between 1 and 65535"
    if not port:
        raise ValueError(f"`{text}` has no port", fix)
    if not _DIGITS_RE.fullmatch(port):
        raise ValueError(f"port `{port}` is not a number", fix)
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port {int(port)} is out of range (1-65535)", fix)
    return Address(host, int(port))


def _bad_host(host: str) -> NoReturn:
    raise ValueError(
        f"`{host}` is not a valid hostname or IP address",
        f"use letters, digits, `-` and `.` (no `_` or spaces), e.g. `localhost:{PORT}` or `10.0.0.5:{PORT}`",
    )


def _valid_host(host: str) -> bool:
    """A hostname or an IPv4 address; all-digit-and-dot names must be real IPv4 addresses."""
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    return bool(_HOSTNAME_RE.fullmatch(host))


def _valid_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


RESTART_KEYS = ("policy", "max_restarts", "backoff")


def _restart(doc: Doc, path: str, value: Any) -> Any:
    """`{policy: never | on-failure | exit-code, max_restarts: N, backoff: seconds}`."""
    example = "e.g. `restart: {policy: on-failure, max_restarts: 3, backoff: 10}`"
    if not isinstance(value, dict):
        return type_error(doc, path, "a mapping", value, example)
    before = len(doc.problems)
    for key in value:
        if key not in RESTART_KEYS:
            unknown_key(doc, f"{path}.{key}", key, "key", RESTART_KEYS)
    policy = value.get("policy", "on-failure")
    if policy not in RESTART_POLICIES:
        doc.problem(f"{path}.policy", f"expected one of {', '.join(RESTART_POLICIES)}, found {policy!r}", example)
    count = value.get("max_restarts", DEFAULT_MAX_RESTARTS)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        doc.problem(f"{path}.max_restarts", f"must be a whole number, 0 or more, found {count!r}", example)
    backoff = _seconds(DEFAULT_BACKOFF, "to restart at once")(
        doc, f"{path}.backoff", value.get("backoff", DEFAULT_BACKOFF)
    )
    if len(doc.problems) > before:
        return INVALID
    return RestartPolicy(policy, count, backoff)


def _shell_commands(example: str, instead: str) -> Validator:
    """Shell commands as written: tfctl fills in no placeholders there, so one that looks like a
    placeholder is a mistake (`instead` says what to write)."""

    def validate(doc: Doc, path: str, value: Any) -> Any:
        if not isinstance(value, list):
            raw = doc.raw(path)
            key = path.rsplit(".", 1)[-1]
            fix = f'make it a list: `{key}: ["{raw}"]`' if isinstance(value, str) else f"e.g. `{example}`"
            return type_error(doc, path, "a list of shell commands", value, fix)
        commands = [_string(doc, f"{path}[{i}]", item, example) for i, item in enumerate(value)]
        for i, command in enumerate(commands):
            used = [name for name in PLACEHOLDERS if command is not INVALID and "{" + name + "}" in command]
            if used:
                commands[i] = doc.problem(
                    f"{path}[{i}]",
                    f"`{{{used[0]}}}` is not filled in: {path} commands run as written, with no placeholders",
                    instead,
                )
        return INVALID if any(c is INVALID for c in commands) else tuple(commands)

    return validate


_setup = _shell_commands(
    "setup: [python3 -m venv .venv, .venv/bin/pip install -r requirements.txt]",
    "write the value itself (e.g. the interpreter's path instead of `{python}`)",
)
_notify = _shell_commands(
    "notify: ['curl -sS -d @- https://chat.example.com/hook']",
    "the event is on the command's stdin as JSON and in its environment: e.g. `$TFCTL_EVENT_RUN_ID`",
)


def _exclude(doc: Doc, path: str, value: Any) -> Any:
    """Glob patterns matched against each path component and each relative path."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        return type_error(doc, path, "a list of glob patterns", value, 'e.g. `exclude: [data, "*.ckpt"]`')
    return tuple(value)


def _progress_regex(doc: Doc, path: str, value: Any) -> Any:
    """A regex with a `step` or `rate` group; hosts search their logs with it as bytes."""
    example = r'progress: {regex: "iter (?P<step>\d+)"}'
    text = _string(doc, path, value, example)
    if text is INVALID:
        return INVALID
    try:
        groups = re.compile(text).groupindex
        re.compile(text.encode("utf-8"))
    except (re.error, ValueError) as e:
        return doc.problem(path, f"is not a valid regular expression: {e}", f"e.g. `{example}`")
    if not {"step", "rate"} & set(groups):
        return doc.problem(path, "has no (?P<step>...) or (?P<rate>...) group", f"name the number, e.g. `{example}`")
    return text


_progress = Section(
    {
        "regex": _progress_regex,
        "stall_timeout": _seconds(DEFAULT_STALL_TIMEOUT),
        "window": _seconds(DEFAULT_PROGRESS_WINDOW),
        "on_stall": _choice(STALL_ACTIONS, "e.g. `progress: {stall_timeout: 600, on_stall: fail}`"),
    },
    ProgressSettings,
    "progress: {stall_timeout: 300}",
)


# Each top-level key fills the ClusterConfig field of the same name: a new setting is one line
# here plus the field in model.py (and `REQUIRED` if it must be present).
TOP_KEYS: dict[str, Validator] = {
    "name": _name,
    "command": _command,
    "python": _python,
    "workdir": _workdir,
    "env": _env,
    "setup": _setup,
    "notify": _notify,
    "grace_period": _seconds(DEFAULT_GRACE_PERIOD),
    "startup_timeout": _seconds(DEFAULT_STARTUP_TIMEOUT),
    "success_policy": _choice(
        SUCCESS_POLICIES, "write `success_policy: chief` (the default) or `success_policy: all_workers`"
    ),
    "jobs": _jobs,
    "ssh": _ssh,
    "hosts": _hosts,
    "sync": _boolean,
    "exclude": _exclude,
    "hang_timeout": _seconds(DEFAULT_STARTUP_TIMEOUT),
    "fail_on_ps_exit": _boolean,
    "lease_timeout": _seconds(DEFAULT_LEASE_TIMEOUT, "to keep the tasks of an attached run going without it"),
    "idle_ps_timeout": _seconds(DEFAULT_IDLE_PS_TIMEOUT, "to never stop an idle ps on its own"),
    "host_timeout": _seconds(DEFAULT_HOST_TIMEOUT),
    "progress": _progress,
    "metrics": _metrics,
    "start_order": _choice(
        START_ORDERS, "`together` starts every task at once (as by hand); `ordered` starts the ps first, then worker 0"
    ),
    "logdir": _logdir,
    "kubernetes": _kubernetes,
    "container": _container,
    "sweep": _sweep,
    "tracking": tracking,
    **pool_keys.TOP_KEYS,
    "params": lambda _doc, _key, value: MappingProxyType(dict(value)),  # checked and put in (`params.py`)
}
REQUIRED = {
    "name": "add `name: mnist`: it names runs and their directories",
    "jobs": f"add `jobs:` with the tasks' addresses, e.g. `jobs: {{worker: [localhost:{PORT}]}}`",
}
_JOB_KEYS: dict[str, Validator] = {
    "hosts": _addresses,
    "command": _command,
    "env": _env,
    "restart": _restart,
    "gpus": _whole_number("GPUs per task", 0, "e.g. `gpus: 1`"),
    "cpus": _whole_number("CPU cores per task", 0, "e.g. `cpus: 1`"),
    "container": _container,
    **pool_keys.JOB_KEYS,
}


def top_keys() -> dict[str, Validator]:
    """Every top-level key: the file's own, `backend`, and each backend's sections (read from the
    registry on every call, so a backend registered later is known)."""
    names = backends.names()
    return {
        **TOP_KEYS,
        "backend": _choice(names, "; ".join(backends.settings(name).DESCRIPTION for name in names)),
        **{key: section for name in names for key, section in backends.settings(name).SECTIONS.items()},
    }


def job_keys() -> dict[str, Validator]:
    """Every key of a job: its own and those each backend adds (a task count, a port)."""
    names = backends.names()
    return {**_JOB_KEYS, **{key: check for name in names for key, check in backends.settings(name).JOB_KEYS.items()}}
