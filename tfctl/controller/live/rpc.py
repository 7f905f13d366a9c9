"""The live controller's door: a Unix socket in the run's directory through which `status` and
`down` in another terminal use the connections the run's controller (its detached watcher, or an
attached `up`) already holds, instead of opening one SSH connection per host again.

One request per connection: a JSON line `{"verb": ..., "args": {...}}`, answered by one JSON
line, `{"ok": {...}}` or `{"error": ..., "hint": ...}`; a streamed verb (`logs`) first says
`{"streaming": true}` at once, then sends any number of `{"part": {...}}` lines. Requests and
answers are the typed records of `rpc_messages`, encoded and decoded here only. The socket is
owner-only (mode 0600, and the peer's uid is checked), and it is only ever used on the machine
whose controller made it: a run store on a shared home is read from other machines too.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Mapping, TypeVar, cast

from tfctl import trace
from tfctl.controller.live.rpc_messages import DoorRequest
from tfctl.controller.live.watcher import controller_elsewhere, controller_lives
from tfctl.errors import TfctlError
from tfctl.runs.record import RunRecord
from tfctl.supervisor.records import Wire

SOCKET_NAME = "control.sock"
# Bounds of one line on the socket: a request is a verb and its few arguments; an answer may be
# `top`'s history of every task (a 100-task run's is about 320 KiB).
MAX_REQUEST = 64 * 1024
MAX_ANSWER = 16 * 1024 * 1024
# The longest path bind() takes (sun_path is 108 bytes); longer ones are reached through the
# directory's descriptor in /proc/self/fd.
MAX_SOCKET_PATH = 100
CONNECT_PATIENCE = 5.0  # seconds, for a streamed answer's first exchange

A = TypeVar("A", bound=Wire)
RequestClass = type[DoorRequest[Any]]
Handler = Callable[[Any], Wire]  # a request of its class -> its answer
# A streamed answer: its parts, given the request and whether the asker is still there.
StreamHandler = Callable[[Any, Callable[[], bool]], Iterator[Wire]]


def socket_path(run_dir: Path) -> Path:
    return run_dir / SOCKET_NAME


@contextlib.contextmanager
def _short(path: Path) -> Iterator[str]:
    """A name for `path` that fits in a socket address."""
    if len(os.fsencode(str(path))) <= MAX_SOCKET_PATH:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


class ControllerDoor:
    """Serves `handlers` (request class -> its answer) and `streams` (request class -> its parts)
    on the run's socket while open. No I/O until `open`."""

    def __init__(
        self,
        path: Path,
        handlers: Mapping[RequestClass, Handler],
        streams: Mapping[RequestClass, StreamHandler] | None = None,
    ) -> None:
        self.path = path
        self._handlers = {cls.VERB: (cls, handler) for cls, handler in handlers.items()}
        self._streams = {cls.VERB: (cls, stream) for cls, stream in (streams or {}).items()}
        self._listener: socket.socket | None = None
        self._inode: int | None = None
        self._busy: list[threading.Thread] = []

    def __enter__(self) -> ControllerDoor:
        self.open()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Listen; a door that cannot open (a read-only run store) leaves others to reach the
        hosts themselves, as without a live controller."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound and listening under a name of its own first, then renamed into place (replacing
        # one left by a controller that was killed): whoever sees the socket can connect to it.
        ready = self.path.with_name(f".{SOCKET_NAME}.{os.getpid()}.{threading.get_ident()}")
        try:
            with contextlib.suppress(FileNotFoundError):
                ready.unlink()
            with _short(ready) as name:
                listener.bind(name)
            os.chmod(ready, 0o600)
            listener.listen(16)
            self._inode = ready.stat().st_ino
            os.replace(ready, self.path)
        except OSError:
            listener.close()
            with contextlib.suppress(OSError):
                ready.unlink()
            return
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed
                return
            worker = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._busy = [t for t in self._busy if t.is_alive()] + [worker]
            worker.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                if not _same_user(conn):
                    return
                conn.settimeout(5)
                line = json.loads(_read_line(conn, MAX_REQUEST, "request"))
                verb, args = line["verb"], line.get("args") or {}
                conn.settimeout(None)
                if verb in self._streams:
                    cls, stream = self._streams[verb]
                    answer = self._stream(conn, verb, stream, cls.from_wire(args))
                elif verb in self._handlers:
                    cls, handler = self._handlers[verb]
                    answer = self._answer(verb, handler, cls.from_wire(args))
                else:
                    answer = {"error": f"the run's controller does not serve `{verb}`"}
                conn.sendall(json.dumps(answer).encode() + b"\n")
            except TooLong as e:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"error": str(e)}).encode() + b"\n")
            except (OSError, ValueError, KeyError, TypeError):
                return  # the asker went away or sent nonsense: it falls back to the hosts

    def _answer(self, verb: str, handler: Handler, request: DoorRequest[Any]) -> dict[str, Any]:
        try:
            return {"ok": handler(request).to_wire()}
        except TfctlError as e:
            return {"error": e.message, "hint": e.hint}
        except Exception as e:  # noqa: BLE001 - the asker reports it; the controller keeps the run
            return {"error": f"the run's controller failed to answer `{verb}`: {e!r}"}

    def _stream(
        self, conn: socket.socket, verb: str, stream: StreamHandler, request: DoorRequest[Any]
    ) -> dict[str, Any]:
        """Send the parts as they come; the final answer, once they end (or the asker left)."""
        parts = stream(request, lambda: _still_there(conn))
        conn.sendall(b'{"streaming": true}\n')
        try:
            for part in parts:
                conn.sendall(json.dumps({"part": part.to_wire()}).encode() + b"\n")
        except TfctlError as e:
            return {"error": e.message, "hint": e.hint}
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - as for a single answer
            return {"error": f"the run's controller failed to answer `{verb}`: {e!r}"}
        finally:
            getattr(parts, "close", lambda: None)()  # a generator's `finally` runs now, not at GC
        return {"ok": {}}

    def close(self, wait: float = 30.0) -> None:
        """Stop listening; let answers being written finish (a `down` answer above all)."""
        if self._listener is None:
            return
        with contextlib.suppress(OSError):
            if self.path.stat().st_ino == self._inode:
                self.path.unlink()
        self._listener.close()
        self._listener = None
        for worker in self._busy:
            if worker is not threading.current_thread():
                worker.join(wait)


def _still_there(conn: socket.socket) -> bool:
    """The asker has not closed its end (it sends nothing after its request)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid in (os.getuid(), 0)


class TooLong(ValueError):
    """A line on the socket longer than its bound; the message names the bound."""


def _too_long(what: str, limit: int) -> TooLong:
    bound = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
    return TooLong(f"the controller's {what} is longer than its bound of {bound}")


def _read_line(conn: socket.socket, limit: int, what: str) -> bytes:
    """One line of at most `limit` bytes (`what`: request or answer, for the error)."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise _too_long(what, limit)
    return bytes(data)


def _request_line(request: DoorRequest[Any]) -> bytes:
    return json.dumps({"verb": request.VERB, "args": request.to_wire()}).encode() + b"\n"


def ask(run_dir: Path, record: RunRecord, request: DoorRequest[A], timeout: float) -> A | None:
    """The live controller's answer to `request`; None when the run has no live controller here
    that answers (none, gone, one too old to have a door, or silent for `timeout` seconds, or an
    answer this tfctl cannot read): the caller then connects to the hosts itself. An error the
    controller reports is raised."""
    path = socket_path(run_dir)
    if controller_lives(record) and path.exists():
        with trace.span("live.ask", verb=request.VERB):
            line = _exchange(path, request, timeout)
    else:
        relay = door_relay(record, path)
        if relay is None:
            return None
        with trace.span("live.ask", verb=request.VERB, relayed=True):
            line = _exchange_through(relay, request, timeout)
    if line is None:
        return None
    try:
        answer = json.loads(line)
    except ValueError:  # it closed without answering
        return None
    if isinstance(answer, dict) and "error" in answer:
        raise TfctlError(answer["error"], hint=answer.get("hint"))
    try:
        return cast(A, request.ANSWER.from_wire(answer["ok"]))
    except (ValueError, KeyError, TypeError):  # an answer in a form this tfctl cannot read
        return None


def _exchange(path: Path, request: DoorRequest[Any], timeout: float) -> bytes | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            with _short(path) as name:
                conn.connect(name)
            conn.sendall(_request_line(request))
            return _read_line(conn, MAX_ANSWER, "answer")
    except TooLong as e:
        raise TfctlError(str(e)) from None
    except OSError:
        return None


def door_relay(record: RunRecord, door: Path) -> list[str] | None:
    """How to reach the door of a controller on another host (`Backend.door_relay`), if any."""
    if not controller_elsewhere(record):
        return None
    from tfctl.backends.base import backend_for

    return backend_for(record.backend).door_relay(record, door)


def _exchange_through(relay: list[str], request: DoorRequest[Any], timeout: float) -> bytes | None:
    """`_exchange` through a process joined to the door (its stdin and stdout); None when it
    ends, or says nothing for `timeout` seconds, before a whole answer."""
    try:
        proc = subprocess.Popen(
            relay, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
        )
    except OSError:
        return None
    assert proc.stdin is not None and proc.stdout is not None
    deadline = time.monotonic() + timeout
    data = bytearray()
    try:
        proc.stdin.write(_request_line(request))
        proc.stdin.flush()
        with selectors.DefaultSelector() as ready:
            ready.register(proc.stdout, selectors.EVENT_READ)
            while not data.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not ready.select(left):
                    return None
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    return None
                data += chunk
                if len(data) > MAX_ANSWER:
                    raise TfctlError(str(_too_long("answer", MAX_ANSWER)))
        return bytes(data)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.stdin.close()
        proc.stdout.close()
        proc.wait()


def stream(run_dir: Path, record: RunRecord, request: DoorRequest[A]) -> Iterator[A] | None:
    """The live controller's streamed answer to `request`, part by part; None as for `ask` (a
    controller that does not start streaming within CONNECT_PATIENCE seconds counts as none).
    An error the controller reports (before or between parts) is raised."""
    path = socket_path(run_dir)
    if not controller_lives(record) or not path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with trace.span("live.stream", verb=request.VERB):  # until the request is sent
            conn.settimeout(CONNECT_PATIENCE)
            with _short(path) as name:
                conn.connect(name)
            conn.sendall(_request_line(request))
            answers = conn.makefile("rb")
            first = answers.readline(MAX_ANSWER)
        conn.settimeout(None)
    except OSError:  # a timeout included: a stopped or hung controller
        conn.close()
        return None
    try:
        started = json.loads(first)
    except ValueError:
        started = {}
    if "error" in started:
        conn.close()
        raise TfctlError(started["error"], hint=started.get("hint"))
    if not started.get("streaming"):
        conn.close()
        return None
    return _parts(conn, answers, cast("type[A]", request.ANSWER))


def _parts(conn: socket.socket, answers: BinaryIO, part_type: type[A]) -> Iterator[A]:
    with conn, answers:
        while line := answers.readline(MAX_ANSWER + 1):
            if len(line) > MAX_ANSWER:
                raise TfctlError(str(_too_long("answer", MAX_ANSWER)))
            answer = json.loads(line)
            if "part" in answer:
                try:
                    yield part_type.from_wire(answer["part"])
                except (ValueError, KeyError, TypeError) as e:
                    raise TfctlError(
                        f"the run's controller sent a part this tfctl cannot read: {e}",
                        hint="the controller may be of another tfctl version; run the command again once the run ended",
                    ) from None
                continue
            if "error" in answer:
                raise TfctlError(answer["error"], hint=answer.get("hint"))
            return
    raise TfctlError("the run's controller ended before it finished answering", hint="run the command again")
