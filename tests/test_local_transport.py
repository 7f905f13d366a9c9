"""LocalTransport: commands on this machine, as the localhost cluster runs them."""

from __future__ import annotations

import threading

from tfctl.transport.base import Stream
from tfctl.transport.local import LocalTransport


def read_until_closed(stream: Stream) -> tuple[threading.Thread, threading.Event, list[str], list[BaseException]]:
    """A thread reading `stream`; the event is set at its first line."""
    seen: list[str] = []
    failures: list[BaseException] = []
    started = threading.Event()

    def read() -> None:
        try:
            for line in stream.lines():
                seen.append(line)
                started.set()
        except BaseException as e:  # noqa: BLE001  (asserted by the caller)
            failures.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    return reader, started, seen, failures


def test_closing_a_stream_while_another_thread_reads_it_ends_the_reader_cleanly() -> None:
    # Closing the pipe under a blocked reader once crashed the reader inside CPython
    # ("PyMemoryView_FromBuffer(): info->buf must not be NULL"); the reader must just end.
    for _ in range(20):
        stream = LocalTransport().stream("echo up; exec sleep 30")
        reader, started, seen, failures = read_until_closed(stream)
        assert started.wait(10)
        stream.close()
        reader.join(10)
        assert (reader.is_alive(), failures, seen) == (False, [], ["up"])


def test_a_stream_closed_before_anyone_reads_it_yields_nothing() -> None:
    stream = LocalTransport().stream("echo never read; exec sleep 30")
    stream.close()
    assert list(stream.lines()) == []
