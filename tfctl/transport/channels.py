"""An SSH channel as tfctl uses it: a remote command's output stream (`SSHStream`) and a
forwarded TCP connection (`ChannelTunnel`). paramiko's channels are only passed in (`Channel`
says what of them is used), so `ssh.py` stays the only module that imports paramiko.
"""

from __future__ import annotations

import codecs
import sys
import threading
from typing import Callable, Iterator, Protocol

from tfctl import console
from tfctl.transport.base import Stream, Tunnel


class Channel(Protocol):
    """What these wrappers use of a paramiko Channel."""

    status_event: threading.Event

    def recv(self, size: int) -> bytes: ...

    def recv_stderr(self, size: int) -> bytes: ...

    def sendall(self, data: bytes) -> None: ...

    def shutdown_write(self) -> None: ...

    def close(self) -> None: ...


CHUNK = 65536


def write_stderr(text: str) -> None:
    """The default sink for a stream's remote stderr: ours, as a local command's would be, but
    with its control sequences shown, not obeyed (`console.inert_lines`)."""
    sys.stderr.write(console.inert_lines(text))
    sys.stderr.flush()


class SSHStream(Stream):
    """A remote command's stdout, line by line; its stderr goes to `sink` as it arrives, so it
    is neither lost nor left to fill the SSH window and stall the command."""

    def __init__(self, chan: Channel, sink: Callable[[str], None] = write_stderr) -> None:
        self._chan = chan
        self._sink = sink
        threading.Thread(target=self._copy_stderr, daemon=True).start()

    def _copy_stderr(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while data := self._chan.recv_stderr(CHUNK):
            if text := decoder.decode(data):
                self._sink(text)

    def lines(self) -> Iterator[str]:
        pending = b""
        while data := self._chan.recv(CHUNK):  # b"" once the command ends, the link drops or close()
            *complete, pending = (pending + data).split(b"\n")
            for line in complete:
                yield line.decode("utf-8", errors="replace")
        if pending:
            yield pending.decode("utf-8", errors="replace")
        self._chan.status_event.wait()  # stdout can close before the command exits, as with local

    def send(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except (OSError, EOFError) as e:
            raise OSError(f"the remote command's stdin is closed: {e}") from e

    def close(self) -> None:
        self._chan.close()


class ChannelTunnel(Tunnel):
    """A direct-tcpip channel: a TCP connection the SSH server opened for us."""

    def __init__(self, chan: Channel) -> None:
        self._chan = chan

    def recv(self, size: int) -> bytes:
        return self._chan.recv(size)

    def sendall(self, data: bytes) -> None:
        self._chan.sendall(data)

    def shutdown_write(self) -> None:
        try:
            self._chan.shutdown_write()
        except (OSError, EOFError):
            pass

    def close(self) -> None:
        self._chan.close()
