"""The cluster-file key reference, generated from the code that reads the keys.

Every key comes from the validators `tfctl.config` runs (`fields.top_keys()`, `fields.job_keys()`,
and the keys of each `Section`); its type and default from the dataclass field it fills; its
meaning from the `KEY_DOCS` next to it. `tfctl_reference` writes them as one table per section into
`docs/reference/cluster-file.md`; `tests/test_docs.py` fails on a key without a doc string.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator

from tfctl.config import container, fields, key_docs, kubernetes, pool_keys, ssh_hosts, sweep_keys, tracking_keys
from tfctl.config.base import Section
from tfctl.config.model import ClusterConfig, HostConfig, Job, RestartPolicy, SSHSettings
from tfctl.registry import backends

# `<job>` and `<host>` stand for any job or host name in key paths.
JOB = "jobs.<job>"
HOST = "hosts.<host>"
# Keys whose dataclass field has another name.
_RENAMED = {"hosts": "addresses", "ssh": "destination"}
# How a field's annotation reads to someone writing YAML.
_WORDS = {
    "str": "string",
    "float": "seconds",
    "int": "whole number",
    "bool": "boolean",
    "Path": "path",
    "tuple[str, ...]": "list of strings",
    "ContainerSettings": "mapping",
    "tuple[Address, ...]": "list of host[:port]",
    "Mapping[str, str]": "mapping of strings",
}


@dataclass(frozen=True)
class KeyRow:
    """One key of the reference: where it is, what it takes, what it is without it, what it does."""

    path: str
    section: str  # the path of the mapping it is in ("" at the top level)
    type: str
    default: str
    doc: str


def documented() -> dict[str, str]:
    """Every key's one-line doc, from each module that declares keys."""
    docs = {
        **key_docs.KEY_DOCS,
        **ssh_hosts.KEY_DOCS,
        **kubernetes.KEY_DOCS,
        **container.KEY_DOCS,
        **sweep_keys.KEY_DOCS,
        **pool_keys.KEY_DOCS,
        **tracking_keys.KEY_DOCS,
    }
    for name in backends.names():
        docs.update(getattr(backends.settings(name), "KEY_DOCS", {}))
    return docs


def key_rows() -> list[KeyRow]:
    """Every key the cluster file accepts, in the order the code declares them."""
    docs = documented()
    return [
        KeyRow(path, path.rpartition(".")[0], *_type_and_default(path, owner), docs.get(path, ""))
        for path, owner in _keys()
    ]


def _keys() -> Iterator[tuple[str, Any]]:
    """(key path, the dataclass the key fills a field of, or None) for every key."""
    backend_sections = {key: name for name in backends.names() for key in backends.settings(name).SECTIONS}
    for key, validator in fields.top_keys().items():
        owner: Any = ClusterConfig
        if key in backend_sections:
            owner = type(backends.settings(backend_sections[key]).settings({}))
        yield key, owner
        if key == "jobs":
            for job_key, job_validator in fields.job_keys().items():
                yield f"{JOB}.{job_key}", Job
                if job_key == "restart":
                    yield from ((f"{JOB}.restart.{k}", RestartPolicy) for k in fields.RESTART_KEYS)
                elif isinstance(job_validator, Section):  # a backend's own keys of a job (`slurm:`)
                    yield from ((f"{JOB}.{job_key}.{k}", job_validator.build) for k in job_validator.fields)
        elif key == "hosts":
            for host_key in ssh_hosts.host_entry("<host>").fields:
                is_ssh = host_key == "ssh" or host_key not in {f.name for f in dataclasses.fields(HostConfig)}
                yield f"{HOST}.{host_key}", SSHSettings if is_ssh else HostConfig
        elif isinstance(validator, Section):
            yield from _section_keys(key, validator)


def _section_keys(path: str, section: Section) -> Iterator[tuple[str, Any]]:
    """A section's keys, and those of the sections in it (`tracking.mlflow.uri`)."""
    build = section.build if dataclasses.is_dataclass(section.build) else None
    for key, validator in section.fields.items():
        yield f"{path}.{key}", build
        if isinstance(validator, Section):
            yield from _section_keys(f"{path}.{key}", validator)


def _type_and_default(path: str, owner: Any) -> tuple[str, str]:
    key = path.rpartition(".")[2]
    if key in fields.REQUIRED and "." not in path:
        default = "required"
    else:
        default = "–"
    found = [f for f in dataclasses.fields(owner) if f.name == _RENAMED.get(key, key)] if owner else []
    if not found:
        return "mapping", default
    field = found[0]
    annotation = str(field.type).replace(" | None", "")
    words = _WORDS.get(annotation, "mapping")
    if default == "required":
        return words, default
    if field.default is not dataclasses.MISSING:
        return words, _shown(field.default, words)
    if field.default_factory is not dataclasses.MISSING:
        return words, _shown(field.default_factory(), words)
    return words, default


def _shown(value: Any, words: str) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"{value:g}" + (" s" if words == "seconds" else "")
    if isinstance(value, tuple) or hasattr(value, "keys"):
        return ", ".join(f"`{v}`" for v in value) if value else "none"
    if dataclasses.is_dataclass(value):
        return "–"
    return f"`{value}`"
