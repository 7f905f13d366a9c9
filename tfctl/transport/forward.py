"""A local port forwarded to a port on a host's loopback, like `ssh -L`.

Each connection to 127.0.0.1:<port> here gets its own tunnel (an SSH direct-tcpip channel, or a
plain socket for this machine) and two threads copying bytes, one per direction; a side that
ends half-closes the other, so HTTP keep-alive and request bodies behave as over a plain socket.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
from typing import Callable

from tfctl.errors import TfctlError
from tfctl.transport.base import Tunnel

CHUNK = 65536


def listen(port: int) -> tuple[socket.socket, bool]:
    """A listening socket on 127.0.0.1:`port`, or on a free port when that one is taken; and
    whether it was taken. Loopback only: nobody else on the network reaches the host this way."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT of an earlier run is fine
    try:
        sock.bind(("127.0.0.1", port))
        taken = False
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            sock.close()
            raise TfctlError(f"cannot listen on 127.0.0.1:{port}: {e.strerror}") from e
        sock.bind(("127.0.0.1", 0))
        taken = True
    sock.listen(16)
    return sock, taken


class Forwarder:
    """Relays connections to a listening socket through tunnels from `open_tunnel`, until closed.

    `on_error` hears (once per kind) why a connection could not be relayed, e.g. the host is gone.
    """

    def __init__(self, sock: socket.socket, open_tunnel: Callable[[], Tunnel], on_error: Callable[[str], None]) -> None:
        self._sock = sock
        self._open = open_tunnel
        self._on_error = on_error
        self._errors: set[str] = set()
        self._lock = threading.Lock()
        self._open_pairs: set[tuple[socket.socket, Tunnel]] = set()
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="forward")
        self._acceptor.start()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            try:
                tunnel = self._open()
            except TfctlError as e:
                conn.close()
                if e.message not in self._errors:
                    self._errors.add(e.message)
                    self._on_error(e.message)
                continue
            if not self._relay(conn, tunnel):
                return

    def _relay(self, conn: socket.socket, tunnel: Tunnel) -> bool:
        """Start copying both ways; False (and both closed) once the forwarder is closed."""
        pair = (conn, tunnel)
        with self._lock:
            if self._closed:
                conn.close()
                tunnel.close()
                return False
            self._open_pairs.add(pair)
        done = threading.Barrier(2, action=lambda: self._finish(pair))
        threading.Thread(target=self._copy, args=(conn.recv, tunnel.sendall, tunnel.shutdown_write, done)).start()
        threading.Thread(target=self._copy, args=(tunnel.recv, conn.sendall, lambda: _half_close(conn), done)).start()
        return True

    @staticmethod
    def _copy(
        recv: Callable[[int], bytes],
        send: Callable[[bytes], None],
        end: Callable[[], None],
        done: threading.Barrier,
    ) -> None:
        try:
            while data := recv(CHUNK):
                send(data)
        except (OSError, EOFError):
            pass  # either side went away: the connection is over
        end()
        with contextlib.suppress(threading.BrokenBarrierError):
            done.wait()

    def _finish(self, pair: tuple[socket.socket, Tunnel]) -> None:
        with self._lock:
            self._open_pairs.discard(pair)
        pair[0].close()
        pair[1].close()

    def close(self) -> None:
        """Stop listening (the port is closed when this returns) and cut every connection."""
        with self._lock:
            self._closed = True
            pairs = list(self._open_pairs)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._acceptor.join(5)
        self._sock.close()
        for conn, tunnel in pairs:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # wakes the copy threads
            tunnel.close()
            conn.close()


def _half_close(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
