"""Controller side of the host supervisor: typed requests to the supervisor on one host.

The supervisor travels as one zipapp named by its content hash (`supervisor.bundle`), written
under the host's root on first contact and whenever tfctl changes, for localhost exactly as for
SSH hosts. Requests travel as JSON envelopes on stdin, never in the command line, so no
cluster-file value is ever parsed by a remote shell; the command line holds only the quoted
interpreter and zipapp paths.

Every request carries a fresh id. A request whose conversation drops is sent once more on a
new one, which is safe for every verb: the supervisor answers a replayed `start` or `listen`
from its journal instead of running it again.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import posixpath
import queue
import sys
import threading
import time
import uuid
from types import TracebackType
from typing import Any, Callable, Iterator, TypeVar, cast

from tfctl import trace
from tfctl.errors import HostError
from tfctl.runs.record import HostSpec
from tfctl.supervisor import bundle, notes
from tfctl.supervisor.protocol import Envelope, Request, envelope
from tfctl.supervisor.records import Wire
from tfctl.supervisor.stream import FollowEvent, FollowRequest, follow_event_from_wire
from tfctl.transport.base import Result, Stream, Transport, shell_path

A = TypeVar("A", bound=Wire)
T = TypeVar("T")
Heard = Callable[[str], None]  # who hears a request's notes (`supervisor.notes`) before its answer

REMOTE_ROOT = "~/.tfctl"
# A request that waited this long for its answer marks its host as not answering: requests behind
# it fail at once (see `HostAgent._turn`) rather than wait their turn on a frozen host.
BUSY_PATIENCE = 5.0
MISSING = {"missing": "agent"}  # what the serve command line prints when the zipapp is not there


def interpreter(python: str | None, local: bool) -> str:
    """The cluster file's `python`, else this very interpreter locally and `python3` elsewhere."""
    return python or (sys.executable if local else "python3")


class _Conversation:
    """A running `serve`: envelopes written one per line, answers read in order."""

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

    def ask(self, line: bytes, timeout: float | None, on_note: Heard | None = None) -> dict[str, Any]:
        """Send one envelope line; its answer, its notes before it to `on_note`. queue.Empty on
        timeout (with no line meanwhile), EOFError if the conversation ended."""
        try:
            self._stream.send(line)
        except OSError:
            pass  # it ended without reading (no supervisor there): what it printed is still read
        while True:
            text = self._answers.get(timeout=timeout)
            if text is None:
                raise EOFError("the supervisor conversation ended")
            if text.startswith("{"):  # anything else is a note, or noise from the host's shell start-up
                return _parse(text)
            said = notes.heard(text)
            if said is not None and on_note is not None:
                on_note(said)

    def close(self) -> None:
        self._stream.close()


def _parse(text: str) -> dict[str, Any]:
    answer = json.loads(text)
    if not isinstance(answer, dict):
        raise ValueError(f"not an answer: {text[:80]}")
    return answer


def _last_answer(stdout: str) -> dict[str, Any] | None:
    """The answer in a one-shot `serve`'s output, if it gave one."""
    replies = [text for text in stdout.splitlines() if text.startswith("{")]
    try:
        return _parse(replies[-1]) if replies else None
    except ValueError:
        return None


class _FollowStream(Stream):
    """A follow stream that can be reopened once the supervisor was shipped; closing it from
    another thread stops whichever stream is current, and any later reopen."""

    def __init__(self, open_stream: Callable[[], Stream]) -> None:
        self._open = open_stream
        self._lock = threading.Lock()
        self._closed = False
        self._current = open_stream()

    def reopen(self) -> None:
        with self._lock:
            if self._closed:
                raise OSError("the follow stream was closed")
            self._current.close()
            self._current = self._open()

    def lines(self) -> Iterator[str]:
        return self._current.lines()

    def send(self, data: bytes) -> None:
        self._current.send(data)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._current.close()


def open_agent(spec: HostSpec, accept_new_host_keys: bool = False) -> HostAgent:
    """The agent for a run's host: the supervisor reached through the host's transport (or the
    agent its kind of host brings itself). No I/O until first call."""
    own: HostAgent | None = spec.transport.own_agent(spec.name)
    return own if own is not None else HostAgent(spec.connect(accept_new_host_keys), spec.python, spec.root)


class HostAgent:
    """The supervisor on one host, reached through a transport. No I/O until first call."""

    def __init__(
        self, transport: Transport, python: str | None, root: str, busy_patience: float = BUSY_PATIENCE
    ) -> None:
        self.transport = transport
        self.busy_patience = busy_patience  # past this a request unanswered means a frozen host
        self.host = transport.host
        self.python = interpreter(python, transport.is_local)
        self.root = root
        self._conversation: _Conversation | None = None
        self._lock = threading.Lock()
        self._busy_since: float | None = None  # monotonic time the request holding the lock began
        self._unanswered = False  # the last request got no answer within its timeout

    def __enter__(self) -> HostAgent:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- the zipapp on the host

    def artifact_path(self) -> str:
        digest, _ = bundle.artifact()
        return posixpath.join(self.root, f"supervisor-{digest}.pyz")

    def _ship(self) -> None:
        with trace.span("agent.ship", host=self.host):
            _, data = bundle.artifact()
            self.transport.put(data, self.artifact_path(), 0o600)

    def _serve_command(self) -> str:
        """`serve`, started only if the zipapp is there, so no separate round trip checks for it.
        -I -S: the supervisor is stdlib-only, so skipping site-packages and PYTHON* variables
        halves its start-up on every host (and a broken site-packages cannot break it)."""
        pyz = shell_path(self.artifact_path())
        serve = f"{shell_path(self.python)} -I -S {pyz} serve"
        return f"if [ -f {pyz} ]; then exec {serve}; else echo '{json.dumps(MISSING)}'; fi"

    # -- requests

    def call(self, request: Request[A], timeout: float | None = 120, on_note: Heard | None = None) -> A:
        """Send one request and return its typed answer; any failure becomes a HostError.
        `on_note` hears what the request is doing meanwhile (a pull's lines), as it does it.

        Requests share one long-lived `serve` conversation per host. If it drops, the request
        is sent once more on its own (`serve` with the envelope as its whole input), which also
        yields the clearest error when the supervisor cannot run at all.
        """
        verb = request.VERB
        request_id = uuid.uuid4().hex
        line = (json.dumps(envelope(request_id, self.root, request).to_wire()) + "\n").encode()
        with trace.span("agent." + verb, host=self.host), self._turn(verb, timeout):
            try:
                answer = self._ask(line, timeout, on_note)
                self._unanswered = False
            except queue.Empty:
                self._unanswered = True
                self._drop_conversation()
                raise HostError(self.host, f"supervisor `{verb}` gave no answer within {timeout:g}s") from None
            except (OSError, EOFError):
                self._drop_conversation()
                answer = self._ask_once(verb, line, timeout)
            except ValueError as e:
                self._drop_conversation()
                raise HostError(self.host, f"supervisor `{verb}` answered nonsense: {e}") from None
        return self._typed(request, request_id, answer)

    @contextlib.contextmanager
    def _turn(self, verb: str, timeout: float | None) -> Iterator[None]:
        """One request at a time on the conversation. Behind a request that has waited for its
        answer longer than `busy_patience` (a frozen host), fail at once instead of queueing: the
        caller treats the host as not answering, and no thread piles up behind it."""
        busy_since = self._busy_since
        if busy_since is not None and time.monotonic() - busy_since > self.busy_patience:
            if not self._lock.acquire(blocking=False):
                late = time.monotonic() - busy_since
                raise HostError(self.host, f"no answer: its answer to an earlier request is {late:.0f}s late")
        elif not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise HostError(self.host, f"supervisor `{verb}` could not be asked within {timeout:g}s")
        self._busy_since = time.monotonic()
        try:
            yield
        finally:
            self._busy_since = None
            self._lock.release()

    def _ask(self, line: bytes, timeout: float | None, on_note: Heard | None = None) -> dict[str, Any]:
        """Ask on the conversation, opening it when needed."""

        def ask() -> dict[str, Any]:
            if self._conversation is None:
                self._conversation = _Conversation(self.transport.stream(self._serve_command()))
            answer = self._conversation.ask(line, timeout, on_note)
            if answer == MISSING:
                self._drop_conversation()
            return answer

        return self._shipping_if_missing(ask)

    def _ask_once(self, verb: str, line: bytes, timeout: float | None) -> dict[str, Any]:
        """The retry: a conversation of this one request, whose exit code and stderr explain a
        supervisor that cannot start."""
        results: list[Result] = []

        def ask() -> dict[str, Any] | None:
            results.append(self.transport.run(self._serve_command(), stdin=line, timeout=timeout))
            return _last_answer(results[-1].stdout)

        answer = self._shipping_if_missing(ask)
        if answer is not None:
            return answer
        result = results[-1]
        detail = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.exit_code}").splitlines()
        raise HostError(
            self.host,
            f"supervisor `{verb}` failed: {detail[-1] if detail else ''}",
            hint=f"check that {self.python} (Python >= 3.8) runs on {self.host}",
        )

    def _shipping_if_missing(self, ask: Callable[[], T]) -> T:
        """`ask()`; if the host lacks this supervisor (first contact, or tfctl changed), ship it
        and ask again."""
        answer = ask()
        if answer == MISSING:
            self._ship()
            answer = ask()
            if answer == MISSING:
                raise self._still_missing()
        return answer

    def _still_missing(self) -> HostError:
        return HostError(
            self.host,
            f"the supervisor is still missing after it was written to {self.artifact_path()}",
            hint=f"is {self.root} on {self.host} writable and not cleaned up meanwhile?",
        )

    def _typed(self, request: Request[A], request_id: str, answer: dict[str, Any]) -> A:
        if answer.get("id") != request_id:
            detail = f": {answer['error']}" if "error" in answer else ""
            raise HostError(
                self.host,
                f"supervisor answered request {answer.get('id')!r}, not {request.VERB} {request_id!r}{detail}",
            )
        if "error" in answer:
            raise HostError(self.host, str(answer["error"]))
        try:
            return cast(A, request.ANSWER.from_wire(answer["ok"]))
        except (KeyError, ValueError) as e:
            raise HostError(self.host, f"supervisor `{request.VERB}` answered nonsense: {e}") from None

    def _drop_conversation(self) -> None:
        if self._conversation is not None:
            self._conversation.close()
            self._conversation = None

    @property
    def late(self) -> bool:
        """A request has waited longer than `busy_patience` for its answer, or waits behind one that
        got none: the host is frozen."""
        busy_since = self._busy_since
        return busy_since is not None and (self._unanswered or time.monotonic() - busy_since > self.busy_patience)

    def close(self) -> None:
        """End the conversation and the connection (both reopen on the next call). Behind a
        request still waiting for a frozen host, the connection is closed under it, ending it."""
        late = self.late
        if self._lock.acquire(blocking=not late, timeout=-1 if late else self.busy_patience):
            try:
                self._drop_conversation()
            finally:
                self._lock.release()
        self.transport.close()

    # -- follow: a stream of its own

    def follow(self, request: FollowRequest) -> tuple[Stream, Iterator[FollowEvent]]:
        """Start streaming task output; returns the stream (to close) and its events."""
        wire = Envelope(uuid.uuid4().hex, request.VERB, self.root, request.to_wire()).to_wire()
        line = (json.dumps(wire) + "\n").encode()
        stream = _FollowStream(lambda: self.transport.stream(self._serve_command(), stdin=line))

        def events() -> Iterator[FollowEvent]:
            lines = stream.lines()
            first = next(lines, None)
            if first is not None and first.startswith("{") and json.loads(first) == MISSING:
                self._ship()
                stream.reopen()
                lines = stream.lines()
                first = next(lines, None)
            for text in itertools.chain([] if first is None else [first], lines):
                if not text.startswith("{"):
                    continue
                data = json.loads(text)
                if "error" in data:
                    raise HostError(self.host, f"supervisor `follow`: {data['error']}")
                yield follow_event_from_wire(data)

        return stream, events()
