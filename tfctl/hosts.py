"""How to reach a host and where tfctl keeps its files: shared by the transports, plans and store.

Kept apart from the run store so that the transports never import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets: `[::1]:2222`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tfctl_home() -> Path:
    """tfctl's own directory on this machine: $TFCTL_HOME, else ~/.tfctl."""
    return Path(os.environ.get("TFCTL_HOME") or Path.home() / ".tfctl").expanduser()


@dataclass(frozen=True)
class HostSpec:
    """How to reach one host and where its supervisor keeps its files."""

    name: str
    python: str | None
    root: str
    transport: dict[str, Any] = field(default_factory=dict)

    @property
    def shares_files(self) -> bool:
        """This machine, or a Slurm node (Slurm clusters share the filesystem with the login node)."""
        return self.transport.get("kind") in ("local", "slurm")
