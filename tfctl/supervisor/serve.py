"""The supervisor's entry points: the request loop (`serve`) and a task's monitor started by the
controller's backend instead of by `serve` (`monitor`, e.g. as a scheduler's job step).

`serve` reads one request envelope per line on stdin and writes one answer per line on stdout,
until stdin closes. tfctl keeps one such process per host for a whole command, so each request
costs a round trip instead of a new SSH channel and a new Python process; a `follow` request
answers with a stream of events instead, so it gets a process of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from typing import Any, Callable, Dict, Iterator, List

from . import checks, claims, disk, journal, logs, monitor, ports, prune, resume, sync, tasks
from .errors import AgentError
from .files import task_dir
from .protocol import Envelope, Request, answer_to_wire
from .stream import FollowRequest, follow_event_to_wire

HANDLERS: Dict[str, Callable[[str, Any], Any]] = {
    "start": tasks.start,
    "status": tasks.status,
    "stop": tasks.stop,
    "restart": tasks.restart,
    "reap": tasks.reap,
    "ports": checks.ports,
    "info": checks.info,
    "probe": checks.probe,
    "listen": checks.listen,
    "pick_ports": ports.pick_ports,
    "tail": logs.tail,
    "sync_plan": sync.sync_plan,
    "sync_apply": sync.sync_apply,
    "resume": resume.resume,
    "prune": prune.prune,
    "holdings": claims.answer,
}
DEFERRED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def emit(message: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM, SIGHUP and SIGINT until the block ends: a request that must not run twice
    then runs whole and is recorded, or does not run at all. (Handlers, not a signal mask: a
    mask would be inherited by the monitors and tasks started meanwhile.)"""
    pending: List[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: pending.append(signum)) for sig in DEFERRED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in pending:
            os.kill(os.getpid(), signum)


def run(root: str, request: Request[Any], request_id: str) -> Dict[str, Any]:
    """One request's wire answer; a failure is an answer too, never the end of the conversation."""
    try:
        return answer_to_wire(request_id, HANDLERS[request.VERB](root, request))
    except AgentError as e:
        return answer_to_wire(request_id, error=str(e))
    except OSError as e:
        if not disk.refused(e):
            return answer_to_wire(request_id, error="`%s` failed: %s: %s" % (request.VERB, type(e).__name__, e))
        return answer_to_wire(request_id, error="`%s` failed: %s" % (request.VERB, disk.why(e, root)))
    except Exception as e:  # noqa: BLE001 - reported to the controller, which decides
        return answer_to_wire(request_id, error="`%s` failed: %s: %s" % (request.VERB, type(e).__name__, e))


def answer(envelope: Envelope) -> Dict[str, Any]:
    """The answer to a request envelope; one that must not run twice goes through the journal."""
    request = envelope.request()
    if request.IDEMPOTENT:
        return run(envelope.root, request, envelope.id)
    with signals_deferred():
        return journal.once(envelope.root, envelope.id, lambda: run(envelope.root, request, envelope.id))


def serve() -> None:
    """Answer envelopes, one per line, until stdin closes."""
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return
        if not line.strip():
            continue
        request_id = ""
        try:
            envelope = Envelope.from_wire(json.loads(line))
            request_id = envelope.id
            if envelope.verb == FollowRequest.VERB:
                for event in logs.follow(envelope.root, FollowRequest.from_wire(envelope.body)):
                    emit(follow_event_to_wire(event))
            else:
                emit(answer(envelope))
        except BrokenPipeError:
            raise
        except (AgentError, ValueError, OSError) as e:
            emit(answer_to_wire(request_id, error=str(e) or type(e).__name__))


def main(argv: List[str]) -> int:
    if len(argv) == 5 and argv[1] == "monitor":  # started by the backend: the task's directory is this host's
        d = task_dir(argv[2], argv[3], argv[4])
        with open(os.path.join(d, "monitor.log"), "ab") as log:
            os.dup2(log.fileno(), sys.stderr.fileno())
        monitor.monitor(d, argv[3])
        return 0
    if len(argv) == 2 and argv[1] == "serve":
        try:
            serve()
        except BrokenPipeError:
            # The controller went away; what ran is recorded. Quiet the flush at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    sys.stderr.write("usage: %s {serve | monitor ROOT RUN_ID TASK}  (requests: JSON lines on stdin)\n" % argv[0])
    return 2
