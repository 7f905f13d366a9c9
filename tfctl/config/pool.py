"""A pool file: hosts that several runs (and several users) share, and what each offers.

`$TFCTL_HOME/pools/NAME.yaml`, or any path. Its hosts are reached exactly as a cluster file's are
(`ssh:` beside `hosts:`, and each host's own SSH keys); what a host offers is what placement
(`tfctl.engine.placement`) hands out: GPUs by count or by index, CPU cores, and at most `tasks`
tfctl tasks. Parsed as strictly as a cluster file, every problem with its line and fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from tfctl.config import bounded
from tfctl.config.base import INVALID, Doc, Section, Validator, _found, _python, _whole_number, type_error, unknown_key
from tfctl.config.home import tfctl_home
from tfctl.config.model import HostConfig, SSHSettings
from tfctl.config.ssh_hosts import _ssh, host_entry
from tfctl.errors import ConfigError, ConfigProblem

EXAMPLE = "hosts: {gpu1: {gpus: 4, cpus: 32}, gpu2: {gpus: [0, 1]}}"
MAX_GPUS = 1024  # per host; a number past it is a typo, not a machine


@dataclass(frozen=True)
class PoolHost:
    """One host of a pool: what it offers the runs placed on it, and how it is reached.

    `cpus` and `tasks` None: not counted (any number of tasks, no cores handed out)."""

    name: str
    gpus: tuple[int, ...] = ()  # nvidia-smi's indices of the GPUs the pool may hand out
    cpus: int | None = None
    tasks: int | None = None
    reach: HostConfig = field(default_factory=lambda: HostConfig(name=""))


@dataclass(frozen=True)
class Pool:
    """A validated pool file; `name` is its file's stem (`lab` for pools/lab.yaml)."""

    name: str
    path: Path
    hosts: Mapping[str, PoolHost]
    ssh: SSHSettings = field(default_factory=SSHSettings)
    python: str | None = None


def _gpus(doc: Doc, path: str, value: Any) -> Any:
    """A count (`gpus: 4`: indices 0-3) or the indices themselves (`gpus: [0, 1]`)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value <= MAX_GPUS:
            return tuple(range(value))
        return doc.problem(path, f"must be 0 to {MAX_GPUS} GPUs, found {value}", "e.g. `gpus: 4`")
    if not isinstance(value, list):
        return type_error(doc, path, "a number of GPUs or a list of indices", value, "e.g. `gpus: 4` or `gpus: [0, 1]`")
    indices = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < MAX_GPUS:
            found = _found(item, doc.raw(f"{path}[{i}]"))
            return doc.problem(
                f"{path}[{i}]", f"expected a GPU index (0, 1, ...), found {found}", "e.g. `gpus: [0, 1]`"
            )
        if item in indices:
            return doc.problem(f"{path}[{i}]", f"GPU {item} is listed twice", "list each GPU index once")
        indices.append(item)
    return tuple(sorted(indices))


def _pool_host(name: str) -> Section:
    """`gpus`, `cpus` and `tasks`, beside the keys a cluster file's `hosts.<host>` takes."""
    reach = host_entry(name)

    def build(gpus: tuple[int, ...] = (), cpus: int | None = None, tasks: int | None = None, **keys: Any) -> PoolHost:
        return PoolHost(name, gpus, cpus, tasks, reach.build(**keys))

    keys: dict[str, Validator] = {
        "gpus": _gpus,
        "cpus": _whole_number("CPU cores", 1, "e.g. `cpus: 32`"),
        "tasks": _whole_number("tasks", 1, "e.g. `tasks: 4`"),
        **reach.fields,
    }
    return Section(keys, build, f"{name}: {{gpus: 4, cpus: 32}}")


def _hosts(doc: Doc, path: str, value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        return type_error(doc, path, "a mapping of host names to what each offers", value, f"e.g. `{EXAMPLE}`")
    hosts = {
        name: _pool_host(name)(doc, f"{path}.{name}", {} if item is None else item) for name, item in value.items()
    }
    if any(h is INVALID for h in hosts.values()):
        return INVALID
    return MappingProxyType(hosts)


KEYS: dict[str, Validator] = {"hosts": _hosts, "ssh": _ssh, "python": _python}
KEY_DOCS: dict[str, str] = {
    "hosts": "Host name to what it offers: `gpus` (a count or indices), `cpus`, `tasks`, and its SSH keys.",
    "hosts.<host>.gpus": "GPUs the pool hands out: a count (`4`: 0-3) or nvidia-smi's indices (`[0, 1]`).",
    "hosts.<host>.cpus": "CPU cores the pool hands out; unset: cores are not counted on this host.",
    "hosts.<host>.tasks": "At most this many tfctl tasks on the host at once; unset: no limit.",
    "ssh": "How every host is reached, as a cluster file's `ssh:`.",
    "python": "The hosts' interpreter, as a cluster file's `python:`.",
}


def pool_path(name: str, relative_to: Path | None = None) -> Path:
    """Where `pool: NAME` points: a path (it has a `/` or ends in .yaml/.yml), relative to the
    cluster file's folder; otherwise $TFCTL_HOME/pools/NAME.yaml."""
    if "/" in name or name.endswith((".yaml", ".yml")):
        path = Path(name).expanduser()
        return path if path.is_absolute() or relative_to is None else relative_to / path
    return tfctl_home() / "pools" / f"{name}.yaml"


def load_pool(path: Path) -> Pool:
    """Read and validate a pool file; ConfigError with every problem found, in file order."""
    from tfctl.config.loader import compose  # the cluster file's strict YAML reading, positions kept

    try:
        text = bounded.read_head(path).decode("utf-8")
    except FileNotFoundError:
        fix = f"create it, e.g. with `{EXAMPLE}`"
        raise ConfigError([ConfigProblem(path, None, None, "", "no such pool file", fix)]) from None
    except (OSError, UnicodeDecodeError) as error:
        problem = ConfigProblem(path, None, None, "", f"cannot be read: {error}", "make it UTF-8 text, readable")
        raise ConfigError([problem]) from None
    doc = Doc(path)
    root = compose(doc, text)
    pool = None if root is INVALID else _build(doc, root)
    if doc.problems or pool is None:
        doc.problems.sort(key=lambda p: (p.line is None, p.line or 0, p.column or 0))
        raise ConfigError(doc.problems)
    return pool


def _build(doc: Doc, root: Mapping[str, Any]) -> Pool | None:
    """Every top-level key validated; `hosts` required."""
    keys: dict[str, Any] = {}
    for key, value in root.items():
        validator = KEYS.get(key)
        if validator is None:
            unknown_key(doc, key, key, "key", tuple(KEYS))
        elif value is not INVALID:
            keys[key] = validator(doc, key, value)
    if "hosts" not in root:
        doc.problem("hosts", "missing required key `hosts`", f"add `{EXAMPLE}`", at=doc.nodes[""])
    if doc.problems:
        return None
    name = doc.file.name.rsplit(".", 1)[0]
    return Pool(name, doc.file.absolute(), keys["hosts"], keys.get("ssh", SSHSettings()), keys.get("python"))
