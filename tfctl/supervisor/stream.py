"""`follow`: the one request answered by a stream of events (task output, task ends, heartbeats)
instead of one answer, and the compact wire form of those events.

Stdlib only, as all of the supervisor's protocol (`protocol`)."""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Mapping, Optional, Union

from .records import Record, Wire, record
from .states import TaskState


@record
class FollowRequest(Wire):
    """Stream task output from byte offsets; with `follow`, until every task ended and was read."""

    VERB: ClassVar[str] = "follow"  # answered by a stream of events, so not in VERBS

    run_id: str
    tasks: Dict[str, int]  # task -> byte offset to read from
    follow: bool = False
    tail: Optional[int] = None  # start at most this many lines before the end
    since: Optional[float] = None  # start with the lines written in the last this many seconds
    times: bool = False  # each chunk carries when its lines were written


@record
class LogChunk(Record):
    """Output of one task, the bytes as written, up to byte `offset` of its log."""

    task: str
    offset: int
    data: bytes
    stamps: Optional[List[List[float]]] = None  # [log size, time] covering the chunk, when asked for


@record
class TaskEnded(Record):
    """A followed task ended and all its output was sent."""

    task: str
    offset: int
    state: TaskState


@record
class Heartbeat(Record):
    """Sent when nothing else was for a while, so a dead link is noticed."""

    time: float


FollowEvent = Union[LogChunk, TaskEnded, Heartbeat]


def follow_event_to_wire(event: FollowEvent) -> Dict[str, Any]:
    """Compact keys: a follow stream may carry millions of lines. A chunk's bytes travel as text
    decoded with surrogateescape, so any byte (a UTF-8 character cut by a block's end, output
    that is not UTF-8) comes back as it was, at the cost of one decode per chunk."""
    if isinstance(event, LogChunk):
        out = {"t": event.task, "o": event.offset, "d": event.data.decode("utf-8", "surrogateescape")}
        if event.stamps is not None:
            out["w"] = event.stamps
        return out
    if isinstance(event, TaskEnded):
        return {"t": event.task, "o": event.offset, "end": event.state.value}
    return {"hb": event.time}


def follow_event_from_wire(data: Mapping[str, Any]) -> FollowEvent:
    if "hb" in data:
        return Heartbeat(float(data["hb"]))
    if "end" in data:
        return TaskEnded(data["t"], int(data["o"]), TaskState(data["end"]))
    if "d" in data:
        return LogChunk(data["t"], int(data["o"]), data["d"].encode("utf-8", "surrogateescape"), data.get("w"))
    raise ValueError("not a follow event: %r" % (dict(data),))
