"""What a run's live controller answers through its door (`live.ControllerDoor`): `status`,
`down` and `logs` asked from other terminals, served with the connections it already holds."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterator

from tfctl.cluster.answers import StopReport
from tfctl.cluster.cluster import Cluster
from tfctl.controller.live.rpc import ControllerDoor, socket_path
from tfctl.controller.live.rpc_messages import DownAsk, DownReply, LogNote, LogsAsk, LogsPart, StatusAsk, StatusReply
from tfctl.runs.store import RunStore

if TYPE_CHECKING:
    from tfctl.backends.base import BackendReport

RUN_END_CHECK = 2.0  # seconds between looks at whether a followed run has ended
# Characters of log text in one part: as JSON (at most 6 bytes a character, `\u001b`) far below
# the answer's bound, `rpc.MAX_ANSWER`, however long the lines of a batch are.
PART_CHARS = 1 << 20


def controller_door(
    store: RunStore,
    cluster: Cluster,
    on_down: Callable[[float | None], tuple[StopReport | None, BackendReport | None]],
) -> ControllerDoor:
    """This controller's socket. `on_down(grace)` stops the run as this controller must (the
    watcher ends its supervision first; an attached `up` stops at once) and says what it did."""

    def status(request: StatusAsk) -> StatusReply:
        from tfctl.controller.views.status_view import snapshot

        return StatusReply(snapshot(cluster, request.usage_history).to_plain())

    def down(request: DownAsk) -> DownReply:
        report, released = on_down(request.grace)
        return DownReply(report, released)

    def logs(request: LogsAsk, asker_there: Callable[[], bool]) -> Iterator[LogsPart]:
        return logs_parts(store, cluster, request, asker_there)

    path = socket_path(store.run_dir(cluster.record.run_id))
    return ControllerDoor(path, {StatusAsk: status, DownAsk: down}, {LogsAsk: logs})


def _line_parts(blocks: list[tuple[str, list[str]]]) -> Iterator[LogsPart]:
    """Every line with its task, unfolded, in parts of at most PART_CHARS characters (a longer
    line comes in pieces, one after the other)."""
    part: list[list[str]] = []
    size = 0
    for task, lines in blocks:
        for line in lines:
            for start in range(0, max(len(line), 1), PART_CHARS):
                piece = line[start : start + PART_CHARS]
                if part and size + len(piece) > PART_CHARS:
                    yield LogsPart(lines=part)
                    part, size = [], 0
                part.append([task, piece])
                size += len(piece) + len(task)
    if part:
        yield LogsPart(lines=part)


def logs_parts(
    store: RunStore, cluster: Cluster, request: LogsAsk, asker_there: Callable[[], bool]
) -> Iterator[LogsPart]:
    """`tfctl logs` for another terminal: its lines prefixed as it would (`color`), the notes
    on TF patterns that last while following, and the readers' errors at the end."""
    from tfctl.cluster.output import LogFollower, Prefixer
    from tfctl.tf.doctor import LiveNotes
    from tfctl.tf.noise import NoiseFolder

    record = cluster.record
    selected = [record.task(name) for name in request.tasks]
    follow = request.follow and store.load(record.run_id).active
    prefix = Prefixer([t.name for t in record.tasks], request.color, request.terminal)
    notes = LiveNotes(cluster) if follow else None
    last_check = time.monotonic()
    with LogFollower(cluster, selected, follow, request.tail, request.since, request.timestamps) as follower:
        folder = NoiseFolder() if follow else None  # live, TF's healthy noise is folded; after the fact, all shows
        for blocks in follower.blocks():
            if blocks and request.lines:
                yield from _line_parts(blocks)
            elif blocks:
                shown = blocks if folder is None else [(task, folder.fold(task, lines)) for task, lines in blocks]
                text = prefix.text(shown)
                for start in range(0, len(text), PART_CHARS):
                    yield LogsPart(text=text[start : start + PART_CHARS])
            if notes is not None:
                for task, lines in blocks:
                    for line in lines:
                        notes.feed(task, line)
                due = notes.due()
                if due:
                    yield LogsPart(notes=[LogNote(task, finding.cause, finding.fix) for task, finding in due])
            if follow and not blocks and time.monotonic() - last_check > RUN_END_CHECK:
                last_check = time.monotonic()
                if not asker_there():
                    return
                now = store.load(record.run_id)
                if len(now.allocations) != len(record.allocations):  # `logs -f` follows its next one anew
                    return
                if not now.active:  # tasks never started send no end
                    follower.finish()
                    follow = False
        yield LogsPart(errors=follower.errors)
