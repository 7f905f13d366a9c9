"""The `ssh:` and `hosts:` sections of a cluster file: how tfctl reaches each remote host."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from tfctl.config.base import (
    INVALID,
    Doc,
    Section,
    Validator,
    _boolean,
    _found,
    _leaf,
    _python,
    _seconds,
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


_ssh = Section(_SSH_KEYS, SSHSettings, "ssh: {user: ubuntu, connect_timeout: 10}")


def host_entry(name: str) -> Section:
    """The keys of one host under `hosts:`, named `name` in the jobs."""

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
    return Section(keys, build, f"{name}: {{ssh: {name}.example.com, user: ubuntu}}")


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
    hosts = {name: host_entry(name)(doc, f"{path}.{name}", item) for name, item in value.items()}
    if any(h is INVALID for h in hosts.values()):
        return INVALID
    return MappingProxyType(hosts)


# One line per key for the generated reference (see `key_docs.py`).
KEY_DOCS: dict[str, str] = {
    "ssh.user": "User to log in as.",
    "ssh.port": "sshd's port.",
    "ssh.identity_file": "Private key to authenticate with.",
    "ssh.config": "The ssh config file read for each host (HostName, User, ProxyJump, ...); default `~/.ssh/config`.",
    "ssh.connect_timeout": "Seconds to wait for a host's SSH connection (tfctl's default: 10).",
    "ssh.keepalive": "Seconds between SSH keepalives (tfctl's default: 15).",
    "hosts.<host>.ssh": "The SSH destination when it differs from the address tasks use (e.g. an alias).",
    "hosts.<host>.user": "User to log in as on this host.",
    "hosts.<host>.port": "sshd's port on this host.",
    "hosts.<host>.identity_file": "Private key for this host.",
    "hosts.<host>.python": "This host's interpreter, instead of the top-level `python`.",
    "hosts.<host>.local": "`true`: this machine, run without SSH; unset: local when named localhost/127.x/::1.",
}
