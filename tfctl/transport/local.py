"""Commands on this machine, through /bin/sh exactly as a remote host's shell would see them.

Each command gets its own session, as a command over SSH would: the terminal's Ctrl-C reaches
the controller, which decides what to do, and never kills a supervisor call half-way. Only
`attach` (a user's shell or command, on the user's terminal) shares the terminal instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
from typing import Iterator

from tfctl import trace
from tfctl.errors import HostError
from tfctl.transport.base import Result, Stream, Transport, Tunnel


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


class LocalStream(Stream):
    """A local command's stdout. Only the reader closes the pipe once it reads: closing a
    buffered file under a thread that reads it crashes that thread inside CPython."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self._proc = proc
        self._lock = threading.Lock()
        self._reading = self._closed = False

    def lines(self) -> Iterator[str]:
        stdout = self._proc.stdout
        assert stdout is not None
        with self._lock:
            if self._closed:
                return
            self._reading = True
        try:
            for raw in stdout:
                yield raw.decode("utf-8", errors="replace").rstrip("\n")
            self._proc.wait()
        finally:
            stdout.close()

    def send(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError) as e:
            raise OSError(f"the command's stdin is closed: {e}") from e

    def close(self) -> None:
        """End the whole command (its own process group: the shell and what it started)."""
        if self._proc.poll() is None:
            _kill_group(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill_group(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        with self._lock:
            self._closed = True
            pipes = [self._proc.stdin] + ([] if self._reading else [self._proc.stdout])
        for pipe in pipes:  # a reader, if any, sees the end of stdout now and closes it
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):
                    pipe.close()


class SocketTunnel(Tunnel):
    """A plain TCP connection to a port of this machine."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def recv(self, size: int) -> bytes:
        return self._sock.recv(size)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def shutdown_write(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._sock.close()


@contextlib.contextmanager
def _leaving_signals_to_the_child() -> Iterator[None]:
    """While a command runs on our terminal, the terminal's Ctrl-C and Ctrl-\\ are for it: we
    only wait for it to end. A no-op handler, not SIG_IGN, so the child keeps the default."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGQUIT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


class LocalTransport(Transport):
    """The transport for `localhost` and any host tfctl is told is this machine."""

    def __init__(self, host: str = "localhost") -> None:
        self.host = host

    @property
    def is_local(self) -> bool:
        return True

    # Where a stream's stderr goes: ours, as a remote shell's would over SSH.
    _stream_stderr: int | None = None

    def _argv(self, command: str, tty: bool = False) -> list[str]:
        """How this machine runs a command line (another transport may run it elsewhere)."""
        return ["/bin/sh", "-c", command]

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> Result:
        with trace.span("transport.run", self.host, command=command):
            return self._run(command, stdin, timeout)

    def _run(self, command: str, stdin: bytes | None, timeout: float | None) -> Result:
        proc = subprocess.Popen(
            self._argv(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin or b"", timeout=timeout)
        except subprocess.TimeoutExpired as e:
            _kill_group(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise HostError(self.host, f"command timed out after {timeout:g}s: {command}") from e
        return Result(self.host, command, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    def stream(self, command: str, *, stdin: bytes | None = None) -> Stream:
        with trace.span("transport.stream", self.host, command=command):
            proc = subprocess.Popen(
                self._argv(command),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stream_stderr,
                start_new_session=True,
            )
        if stdin is not None:
            assert proc.stdin is not None
            # A command that ends without reading its input (the supervisor is missing, say)
            # closes the pipe first: what it printed is still there to read.
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(stdin)
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        return LocalStream(proc)

    def attach(self, command: str, *, tty: bool) -> int:
        """The command shares our terminal and process group, so the terminal's signals reach it
        and a shell's job control works; a death by signal comes back as 128 + its number."""
        with trace.span("transport.attach", self.host, command=command), _leaving_signals_to_the_child():
            keys = not tty and os.isatty(0)  # keystrokes for a program without a terminal: none
            proc = subprocess.Popen(self._argv(command, tty), stdin=subprocess.DEVNULL if keys else None)
            code = proc.wait()
        return 128 - code if code < 0 else code

    def tunnel(self, port: int) -> Tunnel:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError as e:
            raise HostError(self.host, f"cannot connect to port {port}: {e.strerror or e}") from e
        sock.settimeout(None)
        return SocketTunnel(sock)

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        target = os.path.expanduser(path)
        with trace.span("transport.put", self.host, path=path, bytes=len(data)):
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, target)

    def close(self) -> None:
        """Nothing to release for local commands."""
