"""Ways of reaching a host; see base.py for the interface."""

from __future__ import annotations

from tfctl.errors import UsageError
from tfctl.runs.record import HostSpec
from tfctl.transport.base import Transport

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def is_local_name(host: str) -> bool:
    return host in LOCAL_NAMES or host.startswith("127.")


def connect(spec: HostSpec, accept_new_host_keys: bool = False) -> Transport:
    """The transport a host's spec asks for. Constructing it does no I/O.

    paramiko is imported here, on first SSH use only, so local-only runs and `--help` stay fast.
    """
    options = dict(spec.transport)
    kind = options.pop("kind", "local")
    if kind == "local":
        from tfctl.transport.local import LocalTransport

        return LocalTransport(spec.name)
    if kind == "ssh":
        from tfctl.transport.ssh import SSHTransport

        return SSHTransport(spec.name, accept_new_host_keys=accept_new_host_keys, **options)
    if kind == "slurm":
        from tfctl.backends.slurm.transport import SlurmTransport

        return SlurmTransport(spec.name, **options)
    raise UsageError(f"host {spec.name}: unknown transport {kind!r}")
