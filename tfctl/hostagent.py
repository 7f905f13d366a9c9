"""Controller side of the host supervisor: how tfctl calls `supervisor/agent.py` on a host.

Requests travel as JSON on stdin, never in the command line, so no cluster-file value is ever
parsed by a remote shell; the command line holds only the quoted interpreter and agent paths.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Iterator

from tfctl.errors import HostError
from tfctl.transport.base import Stream, Transport, shell_path

AGENT_SOURCE = Path(__file__).parent / "supervisor" / "agent.py"
REMOTE_ROOT = "~/.tfctl"


def interpreter(python: str | None, local: bool) -> str:
    """The cluster file's `python`, else this very interpreter locally and `python3` elsewhere."""
    return python or (sys.executable if local else "python3")


def agent_digest() -> str:
    return hashlib.sha256(AGENT_SOURCE.read_bytes()).hexdigest()[:16]


class HostAgent:
    """The supervisor on one host, reached through a transport. No I/O until first call."""

    def __init__(self, transport: Transport, python: str | None, root: str) -> None:
        self.transport = transport
        self.host = transport.host
        self.python = interpreter(python, transport.is_local)
        self.root = root
        self._agent_path: str | None = None

    def _agent(self) -> str:
        """Path of the agent on the host; shipped once per content hash to remote hosts."""
        if self._agent_path is None:
            if self.transport.is_local:
                self._agent_path = str(AGENT_SOURCE)
            else:
                path = f"{REMOTE_ROOT}/agent-{agent_digest()}.py"
                probe = self.transport.run(f"test -f {path}")
                if not probe.ok:
                    self.transport.put(AGENT_SOURCE.read_bytes(), path, 0o600)
                self._agent_path = path
        return self._agent_path

    def _command(self, verb: str) -> str:
        return f"{shell_path(self.python)} {shell_path(self._agent())} {verb}"

    def call(self, verb: str, payload: dict[str, Any], timeout: float | None = 120) -> dict[str, Any]:
        """Run one agent verb and return its JSON answer; any failure becomes a HostError."""
        payload = {"root": self.root, **payload}
        result = self.transport.run(self._command(verb), stdin=json.dumps(payload).encode(), timeout=timeout)
        try:
            answer = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
        except ValueError:
            answer = None
        if isinstance(answer, dict) and "error" in answer:
            raise HostError(self.host, answer["error"])
        if not result.ok or not isinstance(answer, dict):
            detail = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.exit_code}").splitlines()
            raise HostError(self.host, f"supervisor `{verb}` failed: {detail[-1] if detail else ''}",
                            hint=f"check that {self.python} (Python >= 3.8) runs on {self.host}")
        return answer

    def follow(self, payload: dict[str, Any]) -> tuple[Stream, Iterator[dict[str, Any]]]:
        """Start the agent's `follow` stream; returns the stream (to close) and its events."""
        stream = self.transport.stream(self._command("follow"),
                                       stdin=json.dumps({"root": self.root, **payload}).encode())

        def events() -> Iterator[dict[str, Any]]:
            for line in stream.lines():
                if line.startswith("{"):
                    yield json.loads(line)

        return stream, events()
