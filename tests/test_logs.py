"""LogFollower against a real supervisor: closing, catching up and reconnecting lose nothing."""

from __future__ import annotations

import calendar
import random
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator, cast

import pytest

from bench.waiting import wait_until
from tfctl.cluster.agent import HostAgent
from tfctl.cluster.cluster import Cluster
from tfctl.cluster.output import LINE_BOUND, LogFollower, Prefixer, split_block
from tfctl.runs.record import HostSpec, RunRecord, TaskSpec
from tfctl.supervisor import timeline
from tfctl.supervisor.files import state_root
from tfctl.supervisor.stream import FollowRequest, LogChunk
from tfctl.tf.tasks import DEFAULT_ENV
from tfctl.transport.local import LocalStream, LocalTransport


def one_task_cluster(tmp_path: Path, source: str) -> Cluster:
    # With the environment tfctl gives every task (unbuffered output), not only what the shell running the tests has.
    task = TaskSpec("worker", 0, "localhost", 1, f"{sys.executable} -c {shlex.quote(source)}", dict(DEFAULT_ENV), None)
    record = RunRecord("logs-test", "t", "x", time.time(), (task,), (HostSpec("localhost", None, str(tmp_path)),), 1.0)
    cluster = Cluster(record, {"localhost": HostAgent(LocalTransport(), None, str(tmp_path))})
    cluster.start_tasks([task])
    return cluster


def collect(follower: LogFollower, until=lambda lines: False, then=lambda: None) -> list[str]:
    lines: list[str] = []
    acted = False
    for batch in follower.batches(idle=0.05):
        lines += [line for _, line in batch]
        if not acted and until(lines):
            acted = True
            then()
    return lines


def wait_last_line(cluster: Cluster, text: str) -> None:
    wait_until(
        lambda: cluster.status()[0][0].last_line, 20, f"the task printing {text!r}", until=lambda last: last == text
    )


def output_log(root: Path, cluster: Cluster) -> Path:
    return host_state(root) / "tasks" / cluster.record.run_id / "worker-0" / "output.log"


def noted_whole(log: Path) -> bool:
    """The task's monitor has noted the log's whole size in its output.times (it looks once a second)."""
    times = Path(timeline.times_path(str(log)))
    notes = times.read_bytes() if times.exists() else b""
    if len(notes) < timeline.RECORD.size:
        return False
    _when, size = timeline.RECORD.unpack(notes[-timeline.RECORD.size :])
    return size == log.stat().st_size


def test_finish_mid_stream_reads_the_rest_exactly_once(tmp_path: Path) -> None:
    count = 50_000
    cluster = one_task_cluster(tmp_path, f"import time\nfor i in range({count}): print('line', i)\ntime.sleep(60)")
    try:
        wait_last_line(cluster, f"line {count - 1}")
        follower = LogFollower(cluster, cluster.record.tasks, follow=True)
        lines = collect(follower, until=lambda got: len(got) > 0, then=follower.finish)
        assert lines == [f"line {i}" for i in range(count)]
    finally:
        cluster.stop(grace=1)
        cluster.close()  # its supervisor ends with the link


def test_a_held_partial_line_is_not_repeated_after_a_reconnect(tmp_path: Path) -> None:
    long_line = "x" * 100_000  # longer than the supervisor holds back, so it arrives in pieces
    source = (
        f"import sys, time\nsys.stdout.write('{long_line}'); sys.stdout.flush(); time.sleep(3)\n"
        "print('END'); print('after'); time.sleep(60)"
    )
    cluster = one_task_cluster(tmp_path, source)
    try:
        log = output_log(tmp_path, cluster)
        on_disk = "the long line on disk, still unfinished"
        wait_until(lambda: log.exists() and log.stat().st_size >= len(long_line), 20, on_disk)
        follower = LogFollower(cluster, cluster.record.tasks, follow=True)
        # Deliberately 1 s for the reader to take the long line's first piece and hold it back:
        # nothing outside the reader shows when it has.
        time.sleep(1)
        follower._streams["localhost"].close()  # as if the link dropped; the reader reconnects
        lines = collect(follower, until=lambda got: "after" in got, then=follower.close)
        # Shown in LINE_BOUND pieces (the line is longer), each byte once: nothing repeated.
        assert lines[:3] == [long_line[:LINE_BOUND], long_line[LINE_BOUND:] + "END", "after"]
    finally:
        cluster.stop(grace=1)
        cluster.close()  # its supervisor ends with the link


@pytest.mark.parametrize("color", [False, True])
def test_prefixes_are_aligned_and_coloured_only_when_asked(color: bool) -> None:
    prefix = Prefixer(["ps:0", "worker:10"], color)
    a, b = prefix("ps:0", "x"), prefix("worker:10", "y")
    if color:
        assert a.startswith("\x1b[") and "\x1b[0m" in a
    else:
        assert a == "[ps:0]      x" and b == "[worker:10] y"


def host_state(root: Path | str) -> Path:
    """Where the supervisor on this machine keeps its own files under `root`."""
    return Path(state_root(str(root)))


def written_at(line: str) -> float:
    return calendar.timegm(time.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%SZ"))


def test_since_and_timestamps_use_when_each_line_was_written(tmp_path: Path) -> None:
    # Five lines, a pause of 3.5 s, five more: --since 2 shows only the second five.
    source = (
        "import time\n"
        "for i in range(5): print('early', i, flush=True)\n"
        "time.sleep(3.5)\n"
        "for i in range(5): print('late', i, flush=True)\n"
        "time.sleep(60)\n"
    )
    started = time.time()
    cluster = one_task_cluster(tmp_path, source)
    try:
        wait_last_line(cluster, "late 4")
        log = output_log(tmp_path, cluster)
        wait_until(lambda: noted_whole(log), 5, "the monitor noting when the last lines were written")
        with LogFollower(cluster, cluster.record.tasks, follow=False, since=2.0, timestamps=True) as follower:
            recent = collect(follower)
        assert [line.split(" ", 1)[1] for line in recent] == [f"late {i}" for i in range(5)]
        assert all(started + 3 <= written_at(line) <= time.time() + 1 for line in recent), (started, recent)
        with LogFollower(cluster, cluster.record.tasks, follow=False, timestamps=True) as follower:
            everything = collect(follower)
        assert [line.split(" ", 1)[1] for line in everything[:5]] == [f"early {i}" for i in range(5)]
        # When the task started depends on the machine's load; the pause between the two fives does not.
        assert all(started - 1 <= written_at(line) for line in everything[:5]), (started, everything)
        assert min(map(written_at, everything[5:])) - max(map(written_at, everything[:5])) >= 3, everything
    finally:
        cluster.stop(grace=1)
        cluster.close()  # its supervisor ends with the link


KERAS_LOG = Path(__file__).resolve().parent / "data" / "tf_logs" / "keras_fit_progress_bar.log"


def test_a_keras_bar_redrawn_in_place_moves_live_and_replays_as_its_last_states(tmp_path: Path) -> None:
    # The real bytes of a Keras 3 fit (bars redrawn with backspaces and \r), written as Keras
    # wrote them: one redraw at a time.
    source = (
        "import sys, time\n"
        f"data = open({str(KERAS_LOG)!r}, 'rb').read().split(b'\\n', 3)[3]\n"
        "for i, piece in enumerate(data.split(b'\\r')):\n"
        "    sys.stdout.buffer.write((b'\\r' if i else b'') + piece); sys.stdout.flush(); time.sleep(0.05)\n"
    )
    cluster = one_task_cluster(tmp_path, source)
    try:
        with LogFollower(cluster, cluster.record.tasks, follow=True) as follower:
            live = collect(follower)
        assert not any("\r" in line or "\b" in line for line in live)
        bars = [line for line in live if "/500" in line]
        # Intermediate states arrived on their own, before their epoch's line ended.
        assert len([line for line in bars if "500/500" not in line]) >= 3, bars
        assert len([line for line in bars if "500/500" in line]) == 3
        with LogFollower(cluster, cluster.record.tasks, follow=False) as follower:
            replay = collect(follower)
        assert not any("\r" in line or "\b" in line for line in replay)
        # Afterwards: each epoch's final state, not every redraw.
        assert [line.count("500/500") for line in replay if "/500" in line] == [1, 1, 1]
    finally:
        cluster.stop(grace=1)
        cluster.close()  # its supervisor ends with the link


class ChunkAgent:
    """A host whose follow stream is these events, for the reader's side alone."""

    def __init__(self, events: list[LogChunk]) -> None:
        self.events = events

    def follow(self, request: FollowRequest) -> tuple[LocalStream, Iterator[LogChunk]]:
        return cast(LocalStream, ClosedStream()), iter(self.events)


class ClosedStream:
    def close(self) -> None:
        pass


def test_blocks_cut_anywhere_give_the_same_lines_in_order(tmp_path: Path) -> None:
    # Multi-byte characters, an empty line, a line longer than the pieces; cut at random places,
    # many of them inside a character or between a \r and its \n.
    lines = [f"{i} grüße 日本語 ✓ {'x' * (i % 7) * 300}" for i in range(300)] + ["", "last line €"]
    raw = "\n".join(lines).encode() + b"\n"
    rng = random.Random(7)
    cuts = sorted({0, len(raw), *(rng.randrange(len(raw)) for _ in range(200))})
    events = [LogChunk("worker:0", end, raw[start:end]) for start, end in zip(cuts, cuts[1:])]
    task = TaskSpec("worker", 0, "h", 1, "x", {}, None)
    record = RunRecord("blocks", "t", "x", time.time(), (task,), (HostSpec("h", None, str(tmp_path)),), 1.0)
    cluster = SimpleNamespace(record=record, agents={"h": ChunkAgent(events)})
    with LogFollower(cast(Cluster, cluster), [task], follow=False) as follower:
        got = collect(follower)
    assert got == lines
    assert follower.offsets == {"worker:0": len(raw)}


def test_a_bar_redrawn_across_blocks_shows_its_states_and_keeps_the_line_whole() -> None:
    assert split_block(b"done\n1/3\r2/3\r3/") == (["done"], "2/3", b"3/")
    assert split_block(b"a\rb\n\xe2\x82") == (["b"], "", b"\xe2\x82")  # a character cut in two waits
    prefix = Prefixer(["ps:0", "worker:1"], False)
    assert prefix.text([("ps:0", ["a", "b"]), ("worker:1", []), ("ps:0", ["c"])]) == (
        "[ps:0]     a\n[ps:0]     b\n[ps:0]     c\n"
    )
