"""The one interface every way of reaching a host implements.

Everything above this layer (supervisor client, orchestrator) speaks only these methods, so the
SSH transport is a drop-in for the local one. A test pins that no implementation grows a public
method this interface lacks. Constructors do no I/O: connecting happens on first use.
"""

from __future__ import annotations

import abc
import shlex
from dataclasses import dataclass
from typing import Iterator


def shell_path(path: str) -> str:
    """Quote a path for a host's shell, leaving a leading `~/` for that shell to expand."""
    if path == "~":
        return "~"
    return "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


@dataclass(frozen=True)
class Result:
    """What one command did on one host."""

    host: str
    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Stream(abc.ABC):
    """A command still running on a host whose stdout is read line by line."""

    @abc.abstractmethod
    def lines(self) -> Iterator[str]:
        """Yield stdout lines (without newline) until the command ends or the link drops."""

    @abc.abstractmethod
    def send(self, data: bytes) -> None:
        """Write to the command's stdin (only for streams started with `stdin=None`)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop reading and end the command; safe to call twice."""


class Tunnel(abc.ABC):
    """A TCP connection opened from a host to a port on its own loopback (port forwarding)."""

    @abc.abstractmethod
    def recv(self, size: int) -> bytes:
        """Up to `size` bytes; b"" once the other end closed its side."""

    @abc.abstractmethod
    def sendall(self, data: bytes) -> None:
        """Send all of `data`; OSError if the connection is gone."""

    @abc.abstractmethod
    def shutdown_write(self) -> None:
        """Tell the other end nothing more is coming (half-close)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close both directions; safe to call twice."""


class Transport(abc.ABC):
    """Runs shell command lines on one host. Every value in a command line is already quoted."""

    host: str

    @property
    @abc.abstractmethod
    def is_local(self) -> bool:
        """True when commands run on this machine (files are shared with the controller)."""

    @abc.abstractmethod
    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> Result:
        """Run `command` through the host's shell and wait for it."""

    @abc.abstractmethod
    def stream(self, command: str, *, stdin: bytes | None = None) -> Stream:
        """Start `command` and return its stdout as a stream. With `stdin` bytes, they are its
        whole input; with None, stdin stays open for `Stream.send` (a conversation)."""

    @abc.abstractmethod
    def attach(self, command: str, *, tty: bool) -> int:
        """Run `command` with this terminal: its output goes to our stdout and stderr as it
        comes, and its exit code is returned. With `tty`, on a terminal of its own sized like
        ours, fed our keystrokes (an interactive shell). Without, it reads our stdin if that is
        a pipe or a file, and nothing if it is a terminal."""

    @abc.abstractmethod
    def tunnel(self, port: int) -> Tunnel:
        """A TCP connection to `port` on the host's loopback, opened from the host itself."""

    @abc.abstractmethod
    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Write `data` to `path` on the host atomically, creating parent directories."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection, if any; the transport may be used again afterwards."""
