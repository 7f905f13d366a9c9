"""A fake host's spec: its agent is the `FakeHost` of that name in the lab (no transport at all)."""

from __future__ import annotations

from typing import Any, ClassVar

from tfctl.errors import HostError
from tfctl.supervisor.records import record
from tfctl.transport.base import Transport
from tfctl.transport.specs import TransportSpec


@record
class FakeSpec(TransportSpec):
    KIND: ClassVar[str] = "fake"
    SHARES_FILES: ClassVar[bool] = True  # nothing to sync: there are no files

    def connect(self, host: str, accept_new_host_keys: bool = False) -> Transport:
        raise HostError(host, "a fake host has no transport; its agent is in-process")

    def own_agent(self, host: str) -> Any:
        from tests.fake_backend.backend import LAB

        return LAB.agent(host)


SPEC = FakeSpec
