"""A fake host's spec: its agent is the `FakeHost` of that name in the lab (no transport at all);
`remote` hosts get the workdir synced, as a host that does not share this machine's files."""

from __future__ import annotations

from typing import Any, ClassVar

from tfctl.errors import HostError
from tfctl.supervisor.records import record
from tfctl.transport.base import Transport
from tfctl.transport.specs import TransportSpec


@record
class FakeSpec(TransportSpec):
    KIND: ClassVar[str] = "fake"

    remote: bool = False  # the host does not see this machine's files: the workdir is synced to it

    @property
    def SHARES_FILES(self) -> bool:  # type: ignore[override]  # per host here; per kind of host elsewhere
        return not self.remote

    def connect(self, host: str, accept_new_host_keys: bool = False) -> Transport:
        raise HostError(host, "a fake host has no transport; its agent is in-process")

    def own_agent(self, host: str) -> Any:
        from tests.fake_backend.backend import LAB

        return LAB.agent(host)


SPEC = FakeSpec
