"""A remote command on this terminal: keystrokes and window size out, its output in.

The SSH transport's `attach` relays a channel with these. They need only the few channel
methods below (paramiko's Channel has them all), so nothing here imports paramiko.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import termios
import threading
import tty
from typing import Callable, Iterator, Protocol

CHUNK = 65536
STDIN, STDOUT, STDERR = 0, 1, 2
DEFAULT_SIZE = (80, 24)


class Channel(Protocol):
    """What the relays use of a channel running the remote command."""

    def fileno(self) -> int: ...

    def recv(self, nbytes: int, /) -> bytes: ...

    def recv_stderr(self, nbytes: int, /) -> bytes: ...

    def sendall(self, s: bytes, /) -> None: ...

    def shutdown_write(self) -> None: ...

    def resize_pty(self, width: int = ..., height: int = ..., /) -> None: ...

    def close(self) -> None: ...


def window_size() -> tuple[int, int]:
    """(columns, rows) of our terminal, or 80x24 when none of our standard files is one."""
    for fd in (STDIN, STDOUT, STDERR):
        with contextlib.suppress(OSError):
            size = os.get_terminal_size(fd)
            return size.columns, size.lines
    return DEFAULT_SIZE


def relay_terminal(chan: Channel) -> None:
    """Our keystrokes to `chan` and its output to our stdout until it ends, as `ssh -t` does.

    Our terminal is in raw mode meanwhile (so Ctrl-C, Ctrl-D and Tab go to the remote shell), and
    is restored however this ends; each SIGWINCH is passed on as the new window size.
    """
    with _raw(STDIN), _resize_events() as resized:
        watched = [resized, STDIN, chan.fileno()]
        while True:
            ready = select.select(watched, [], [])[0]
            if resized in ready:  # first: a size change applies to the keystrokes that follow it
                os.read(resized, 512)
                chan.resize_pty(*window_size())
            if STDIN in ready:
                data = os.read(STDIN, CHUNK)
                if data:
                    chan.sendall(data)
                else:  # a program on a pty never sees a channel's EOF: Ctrl-D is the user's
                    watched.remove(STDIN)
            if chan.fileno() in ready:
                data = chan.recv(CHUNK)
                if not data or not _write_all(STDOUT, data):
                    return


def relay_output(chan: Channel) -> None:
    """No terminal: the command's stdout and stderr to ours, each as it arrives, until both end.
    It reads our stdin when that is a pipe or a file, and nothing when it is a terminal (typing
    to a program without a terminal of its own is `tfctl ssh`'s job)."""
    if os.isatty(STDIN):
        chan.shutdown_write()
    else:
        threading.Thread(target=_feed, args=(chan,), daemon=True).start()
    errors = threading.Thread(target=_copy, args=(chan.recv_stderr, STDERR), daemon=True)
    errors.start()
    if not _copy(chan.recv, STDOUT):  # our stdout went away (`| head`): stop the command
        chan.close()
    errors.join()


def _feed(chan: Channel) -> None:
    """Our stdin to the command, then its end; a command that stopped reading is no error."""
    with contextlib.suppress(OSError):
        while data := os.read(STDIN, CHUNK):
            chan.sendall(data)
    with contextlib.suppress(OSError):
        chan.shutdown_write()


def _copy(recv: Callable[[int], bytes], fd: int) -> bool:
    """Copy until the end of `recv`; False if writing to `fd` failed first."""
    while data := recv(CHUNK):
        if not _write_all(fd, data):
            return False
    return True


def _write_all(fd: int, data: bytes) -> bool:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _resize_events() -> Iterator[int]:
    """A descriptor that turns readable at each SIGWINCH (a self-pipe, so select wakes at once)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)

    def note(*_: object) -> None:
        with contextlib.suppress(OSError):  # a full pipe already says "resized"
            os.write(write_fd, b"w")

    main = threading.current_thread() is threading.main_thread()
    kept = signal.signal(signal.SIGWINCH, note) if main else None
    try:
        yield read_fd
    finally:
        if main:
            signal.signal(signal.SIGWINCH, signal.SIG_DFL if kept is None else kept)
        os.close(read_fd)
        os.close(write_fd)
