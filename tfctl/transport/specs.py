"""How a host is reached, as a typed record the run record keeps: one class per kind of transport.

A spec connects itself (`connect`), so nothing dispatches on its kind; stored, it carries its
`kind` so it can be read back. A backend with a transport of its own (a scheduler's job steps) names
its kind after itself and defines the spec as `SPEC` in its package's `transport` module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar, Dict, Mapping, Optional, Type

from tfctl.supervisor.records import Wire, record

if TYPE_CHECKING:
    from tfctl.transport.base import Transport


class TransportSpec(Wire):
    """Base of every transport spec. Constructing one does no I/O."""

    KIND: ClassVar[str] = ""
    # The host sees this machine's files (this machine, or a node of a cluster with a shared
    # filesystem), so nothing is synced to it and its supervisor keeps its files in tfctl's home.
    SHARES_FILES: ClassVar[bool] = False

    def connect(self, host: str, accept_new_host_keys: bool = False) -> Transport:
        raise NotImplementedError

    def own_agent(self, host: str) -> Any:
        """An agent this kind of host brings itself instead of a supervisor reached through its
        transport (an in-process host, as the tests' fake backend has); None for real hosts."""
        return None

    def to_json(self) -> Dict[str, Any]:
        return {"kind": self.KIND, **self.to_wire()}


@record
class LocalSpec(TransportSpec):
    """This machine, through /bin/sh."""

    KIND: ClassVar[str] = "local"
    SHARES_FILES: ClassVar[bool] = True

    def connect(self, host: str, accept_new_host_keys: bool = False) -> Transport:
        from tfctl.transport.local import LocalTransport

        return LocalTransport(host)


@record
class SSHSpec(TransportSpec):
    """A remote host over SSH; unset fields fall back to ~/.ssh/config, then ssh's defaults."""

    KIND: ClassVar[str] = "ssh"
    destination: Optional[str] = None
    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    ssh_config_path: Optional[str] = None
    connect_timeout: Optional[float] = None
    keepalive: Optional[float] = None

    def connect(self, host: str, accept_new_host_keys: bool = False) -> Transport:
        """paramiko is imported here, on first SSH use only, so local runs and `--help` stay fast."""
        from tfctl.transport.ssh import SSHTransport

        options = {name: getattr(self, name) for name in self.FIELDS if getattr(self, name) is not None}
        return SSHTransport(host, accept_new_host_keys=accept_new_host_keys, **options)


BUILT_IN: Dict[str, Type[TransportSpec]] = {"local": LocalSpec, "ssh": SSHSpec}


def read_spec(data: Mapping[str, Any]) -> TransportSpec:
    """A stored spec, by its kind: a built-in one, or the one a backend of that name brings."""
    fields = dict(data)
    kind = fields.pop("kind", "local")
    cls = BUILT_IN.get(kind)
    if cls is None:
        from tfctl.registry import backends

        if kind not in backends.PACKAGES:
            raise ValueError(f"unknown transport {kind!r}")
        cls = importlib.import_module(f"{backends.PACKAGES[kind]}.transport").SPEC
    return cls.from_wire(fields)
