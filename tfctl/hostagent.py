"""Controller side of the host supervisor: how tfctl calls `supervisor/agent.py` on a host.

Requests travel as JSON on stdin, never in the command line, so no cluster-file value is ever
parsed by a remote shell; the command line holds only the quoted interpreter and agent paths.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import sys
from pathlib import Path
from typing import Any, Iterator

from tfctl.errors import HostError
from tfctl.transport.base import Stream, Transport, shell_path

AGENT_SOURCE = Path(__file__).parent / "supervisor" / "agent.py"
REMOTE_ROOT = "~/.tfctl"
MISSING = "'{\"missing\": \"agent\"}'"  # what `serve` answers, shell-quoted, when the agent is not there


def interpreter(python: str | None, local: bool) -> str:
    """The cluster file's `python`, else this very interpreter locally and `python3` elsewhere."""
    return python or (sys.executable if local else "python3")


def agent_digest() -> str:
    return hashlib.sha256(AGENT_SOURCE.read_bytes()).hexdigest()[:16]


class _Conversation:
    """A running `agent.py serve`: requests written one per line, answers read in order."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self._stream.lines():
                self._answers.put(line)
        except (OSError, EOFError):
            pass
        finally:
            self._answers.put(None)

    def ask(self, verb: str, request: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        self._stream.send((json.dumps({"verb": verb, "req": request}) + "\n").encode())
        line = self._answers.get(timeout=timeout)
        if line is None:
            raise EOFError("the supervisor conversation ended")
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise ValueError(f"not an answer: {line[:80]}")
        return answer

    def close(self) -> None:
        self._stream.close()


class HostAgent:
    """The supervisor on one host, reached through a transport. No I/O until first call."""

    def __init__(self, transport: Transport, python: str | None, root: str) -> None:
        self.transport = transport
        self.host = transport.host
        self.python = interpreter(python, transport.is_local)
        self.root = root
        self._shipped = transport.is_local
        self._conversation: _Conversation | None = None
        self._lock = threading.Lock()

    def _agent(self) -> str:
        """Path of the agent on the host: the package file locally, else named by content hash."""
        return str(AGENT_SOURCE) if self.transport.is_local else f"{REMOTE_ROOT}/agent-{agent_digest()}.py"

    def _ship(self) -> None:
        self.transport.put(AGENT_SOURCE.read_bytes(), self._agent(), 0o600)
        self._shipped = True

    def _ensure_shipped(self) -> None:
        """For calls outside a conversation (which checks by itself): copy the agent if missing."""
        if not self._shipped:
            if not self.transport.run(f"test -f {shell_path(self._agent())}").ok:
                self._ship()
            self._shipped = True

    def _command(self, verb: str) -> str:
        # -I -S: the supervisor is stdlib-only, so skipping site-packages and PYTHON* variables
        # halves its start-up on every host (and a broken site-packages cannot break it).
        return f"{shell_path(self.python)} -I -S {shell_path(self._agent())} {verb}"

    def _open_conversation(self) -> _Conversation:
        """`serve`, started only if the agent is there, so no separate round trip checks for it."""
        agent = shell_path(self._agent())
        command = f"if [ -f {agent} ]; then exec {self._command('serve')}; else echo {MISSING}; fi"
        return _Conversation(self.transport.stream(command))

    def call(self, verb: str, payload: dict[str, Any], timeout: float | None = 120) -> dict[str, Any]:
        """Run one agent verb and return its JSON answer; any failure becomes a HostError.

        Requests go through one long-lived `serve` conversation per host; if it cannot be had
        (or dies), the request is made once on its own, which also yields the clearest error.
        """
        payload = {"root": self.root, **payload}
        with self._lock:
            try:
                if self._conversation is None:
                    self._conversation = self._open_conversation()
                answer = self._conversation.ask(verb, payload, timeout)
                if answer.get("missing") == "agent":  # first contact, or tfctl changed: ship it
                    self._drop_conversation()
                    self._ship()
                    self._conversation = self._open_conversation()
                    answer = self._conversation.ask(verb, payload, timeout)
                self._shipped = True
            except queue.Empty:
                self._drop_conversation()
                raise HostError(self.host, f"supervisor `{verb}` gave no answer within {timeout:g}s") from None
            except (OSError, EOFError, ValueError, HostError):
                self._drop_conversation()
                answer = self._call_once(verb, payload, timeout)
        if "error" in answer:
            raise HostError(self.host, answer["error"])
        return answer

    def _call_once(self, verb: str, payload: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        self._ensure_shipped()
        result = self.transport.run(self._command(verb), stdin=json.dumps(payload).encode(), timeout=timeout)
        try:
            answer = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
        except ValueError:
            answer = None
        if isinstance(answer, dict) and ("error" in answer or result.ok):
            return answer
        detail = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.exit_code}").splitlines()
        raise HostError(self.host, f"supervisor `{verb}` failed: {detail[-1] if detail else ''}",
                        hint=f"check that {self.python} (Python >= 3.8) runs on {self.host}")

    def _drop_conversation(self) -> None:
        if self._conversation is not None:
            self._conversation.close()
            self._conversation = None

    def close(self) -> None:
        """End the conversation and the connection (both reopen on the next call)."""
        with self._lock:
            self._drop_conversation()
        self.transport.close()

    def follow(self, payload: dict[str, Any]) -> tuple[Stream, Iterator[dict[str, Any]]]:
        """Start the agent's `follow` stream; returns the stream (to close) and its events."""
        self._ensure_shipped()
        stream = self.transport.stream(self._command("follow"),
                                       stdin=json.dumps({"root": self.root, **payload}).encode())

        def events() -> Iterator[dict[str, Any]]:
            for line in stream.lines():
                if line.startswith("{"):
                    yield json.loads(line)

        return stream, events()
