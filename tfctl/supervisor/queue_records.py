"""What one user's queue tells every other user's on a pool host: the runs it has waiting (so
the pool is shared fairly, not first-come-takes-all) and the starts it is about to make (so two
users' queues never pick the same free GPU). Stdlib only, shipped to the hosts.
"""

from __future__ import annotations

from typing import Any, ClassVar, List, Mapping

from .records import Wire, field, record


@record
class AskNote(Wire):
    """One task of a waiting run: what it asks of a host."""

    task: str
    gpus: int = 0
    cpus: int = 0


@record
class WaitingNote(Wire):
    """A run waiting in its user's queue, as the queue orders it."""

    NESTED: ClassVar[Mapping[str, Any]] = {"asks": ("list", AskNote)}

    run_id: str
    submitted_at: float
    priority: int = 0
    how: str = "together"
    asks: List[AskNote] = field(default_factory=list)


@record
class IntentNote(Wire):
    """A start a queue is making on this host: what it will claim, and when it was first written
    here by this host's clock (set by the host: `claims.write_queue_note`)."""

    run_id: str
    written: float = 0.0
    gpus: List[int] = field(default_factory=list)
    cpus: int = 0
    tasks: int = 0


@record
class QueueNote(Wire):
    """One user's queue as it last wrote it on this host; `user` is the file owner's name and
    `age` the seconds since, by the host's clock (a reader's clock may differ), both set when read."""

    NESTED: ClassVar[Mapping[str, Any]] = {"waiting": ("list", WaitingNote), "intents": ("list", IntentNote)}

    user: str
    store: str = ""  # the run store (`RunStore.store_id`) whose queue it is: one user may have several
    waiting: List[WaitingNote] = field(default_factory=list)
    intents: List[IntentNote] = field(default_factory=list)
    age: float = 0.0
