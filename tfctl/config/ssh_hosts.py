"""The `ssh:` and `hosts:` sections of a cluster file: how tfctl reaches each remote host."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from tfctl.config.base import (
    INVALID,
    Doc,
    Validator,
    _boolean,
    _found,
    _leaf,
    _python,
    _seconds,
    _section,
    _string,
    type_error,
)
from tfctl.config.model import HostConfig, SSHSettings


def _port(doc: Doc, path: str, value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
        return value
    return doc.problem(
        path, f"expected a port number (1-65535), found {_found(value, doc.raw(path))}", f"e.g. `{_leaf(path)}: 22`"
    )


_SSH_KEYS: dict[str, Validator] = {
    "user": lambda doc, path, value: _string(doc, path, value, "user: ubuntu"),
    "port": _port,
    "identity_file": lambda doc, path, value: _string(doc, path, value, "identity_file: ~/.ssh/id_ed25519"),
    "config": lambda doc, path, value: _string(doc, path, value, "config: ~/.ssh/config"),
    "connect_timeout": _seconds(10),
    "keepalive": _seconds(15),
}


_ssh = _section(_SSH_KEYS, SSHSettings, "ssh: {user: ubuntu, connect_timeout: 10}")


def _host_entry(name: str) -> Validator:
    def build(python: str | None = None, local: bool | None = None, **ssh: Any) -> HostConfig:
        if "ssh" in ssh:
            ssh["destination"] = ssh.pop("ssh")
        return HostConfig(name=name, ssh=SSHSettings(**ssh), python=python, local=local)

    keys = {
        "ssh": lambda doc, path, value: _string(doc, path, value, "ssh: gpu1-via-bastion"),
        "python": _python,
        "local": _boolean,
        **{k: v for k, v in _SSH_KEYS.items() if k not in ("config", "connect_timeout", "keepalive")},
    }
    return _section(keys, build, f"{name}: {{ssh: {name}.example.com, user: ubuntu}}")


def _hosts(doc: Doc, path: str, value: Any) -> Any:
    """Host name (as written in `jobs`) -> how to reach it."""
    if not isinstance(value, dict):
        return type_error(
            doc,
            path,
            "a mapping of host names to settings",
            value,
            "e.g. `hosts: {gpu1: {ssh: gpu1-via-bastion, user: ubuntu}}`",
        )
    hosts = {name: _host_entry(name)(doc, f"{path}.{name}", item) for name, item in value.items()}
    if any(h is INVALID for h in hosts.values()):
        return INVALID
    return MappingProxyType(hosts)
