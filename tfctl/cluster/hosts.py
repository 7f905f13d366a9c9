"""How a host named in a file is reached: this machine directly, any other over SSH.

A cluster file's hosts and a pool file's are reached the same way: the host's own settings
(`hosts.<host>`) over the file's `ssh:`, a local name (or `local: true`) without SSH.
"""

from __future__ import annotations

import dataclasses

from tfctl.cluster.agent import REMOTE_ROOT
from tfctl.config.home import tfctl_home
from tfctl.config.model import HostConfig, SSHSettings
from tfctl.runs.record import HostSpec
from tfctl.transport import is_local_name
from tfctl.transport.specs import LocalSpec, SSHSpec


def reach(host: str, own: HostConfig | None, ssh: SSHSettings, python: str | None) -> HostSpec:
    """The host's spec: its own SSH settings over the file's, its interpreter `python`."""
    own = own or HostConfig(host)
    local = own.local if own.local is not None else is_local_name(host)
    if local:
        return HostSpec(host, python, str(tfctl_home()), LocalSpec())
    merged = {
        f.name: getattr(own.ssh, f.name) if getattr(own.ssh, f.name) is not None else getattr(ssh, f.name)
        for f in dataclasses.fields(SSHSettings)
    }
    spec = SSHSpec(
        destination=merged["destination"],
        user=merged["user"],
        port=merged["port"],
        identity_file=merged["identity_file"],
        ssh_config_path=merged["config"],
        connect_timeout=merged["connect_timeout"],
        keepalive=merged["keepalive"],
    )
    return HostSpec(host, python, REMOTE_ROOT, spec)
