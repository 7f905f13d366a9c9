"""Every request and answer through the live controller's door (`rpc`), typed, in one place.

A request names its verb and the type of its answer (of each part, for a streamed verb); `rpc`
alone turns them into JSON lines and back. Light to import: `status` asks the door before it
loads anything that reaches the hosts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Generic, Mapping, TypeVar

from tfctl.supervisor.records import Wire, field, record

if TYPE_CHECKING:
    from tfctl.backends.base import BackendReport
    from tfctl.cluster.answers import StopReport

A = TypeVar("A", bound=Wire)


class DoorRequest(Wire, Generic[A]):
    """Base of every request: its verb, the type of its answer, and whether that comes in parts."""

    VERB: ClassVar[str]
    ANSWER: ClassVar[type[Wire]]
    STREAMED: ClassVar[bool] = False


# ---------------------------------------------------------------- status


@record
class StatusReply(Wire):
    """What `status` shows, as plain data (`views.status_view.Snapshot.to_plain`): the terminal
    that asked renders it, as a table or as JSON."""

    snapshot: dict[str, Any]


@record
class StatusAsk(DoorRequest[StatusReply]):
    """`tfctl status` (and `top`) of the run."""

    VERB: ClassVar[str] = "status"
    ANSWER: ClassVar[type[Wire]] = StatusReply

    usage_history: int = 0  # also each task's last samples of CPU and memory (`top`)


# ---------------------------------------------------------------- down


@record
class DownReply(Wire):
    """What the controller stopped, and what the run's backend said once it released what it held."""

    stop: StopReport | None  # None: the controller ended without stopping anything
    backend: BackendReport | None = None  # None: the backend held nothing for the run

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> DownReply:
        from tfctl.backends.base import BackendReport
        from tfctl.cluster.answers import StopReport  # here: `status` need not import the cluster

        if not isinstance(data, Mapping) or "stop" not in data:
            raise ValueError(f"DownReply: expected an object with `stop`, got {data!r}")
        stop, held = data["stop"], data.get("backend")
        return cls(
            None if stop is None else StopReport.from_wire(stop),
            None if held is None else BackendReport.from_wire(held),
        )


@record
class DownAsk(DoorRequest[DownReply]):
    """`tfctl down`: stop every task, then release what the run's backend holds."""

    VERB: ClassVar[str] = "down"
    ANSWER: ClassVar[type[Wire]] = DownReply

    grace: float | None = None  # None: the run's grace period


# ---------------------------------------------------------------- logs


@record
class LogNote(Wire):
    """A TF pattern in a task's output that lasted (`tf.doctor.LiveNotes`), explained."""

    task: str
    cause: str
    fix: str

    @classmethod
    def from_wire(cls, data: Any) -> LogNote:
        if isinstance(data, list):  # [task, cause, fix], as a controller started by an older tfctl sends it
            data = dict(zip(cls.FIELDS, data))
        return super().from_wire(data)


@record
class LogsPart(Wire):
    """One part of `logs`: output lines as they are printed, notes, or the readers' errors at the end."""

    NESTED: ClassVar[Mapping[str, Any]] = {"notes": ("list", LogNote)}

    text: str = ""  # lines, prefixed (and coloured) as the asker prints them
    lines: list[list[str]] = field(default_factory=list)  # [task, line] each, for an asker that reads `lines`
    notes: list[LogNote] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@record
class LogsAsk(DoorRequest[LogsPart]):
    """`tfctl logs` of some tasks; answered in parts."""

    VERB: ClassVar[str] = "logs"
    ANSWER: ClassVar[type[Wire]] = LogsPart
    STREAMED: ClassVar[bool] = True

    tasks: list[str]
    follow: bool = False
    tail: int | None = None
    since: float | None = None  # seconds
    timestamps: bool = False
    color: bool = False
    terminal: bool = False  # the asker prints to a terminal: control characters shown, not obeyed
    lines: bool = False  # the asker reads each line with its task (the Python API), not printed text
