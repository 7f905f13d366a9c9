"""The trace hook (tfctl/trace.py), the spans the local transport emits, and the benchmark's
reading of trace files (bench/tracefile.py, bench/report.py). Fast: no hosts, no SSH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report, tracefile
from bench.lab import Sample
from tfctl import trace
from tfctl.transport.local import LocalTransport


@pytest.fixture
def trace_file(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(trace.TRACE_ENV, str(path))
    return path


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_off_by_default_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(trace.TRACE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with trace.span("transport.run", "h"):
        pass
    trace.record("x")
    assert not trace.enabled() and list(tmp_path.iterdir()) == []


def test_a_span_writes_one_line_and_records_an_exception_type(trace_file):
    with trace.span("agent.ports", "h1", n=3):
        pass
    with pytest.raises(KeyError), trace.span("agent.start", "h2"):
        raise KeyError("x")
    ok, failed = events(trace_file)
    assert (ok["event"], ok["host"], ok["n"]) == ("agent.ports", "h1", 3) and "error" not in ok
    assert 0 <= ok["seconds"] < 1 and ok["start"] > 1e9 and {"pid", "thread"} <= ok.keys()
    assert (failed["event"], failed["error"]) == ("agent.start", "KeyError")


def test_local_transport_traces_run_stream_and_put(trace_file, tmp_path):
    t = LocalTransport()
    assert t.run("echo hi").stdout == "hi\n"
    assert list(t.stream("echo a").lines()) == ["a"]
    t.put(b"data", str(tmp_path / "d" / "f"))
    got = events(trace_file)
    assert [(e["event"], e["host"]) for e in got] == [
        ("transport.run", "localhost"),
        ("transport.stream", "localhost"),
        ("transport.put", "localhost"),
    ]
    assert got[0]["command"] == "echo hi" and got[2]["bytes"] == 4


# -- bench/tracefile.py ------------------------------------------------------------------------

AGENT = "~/.tfctl/agent-0123abcd.py"
SERVE = f"if [ -f {AGENT} ]; then exec python3 -I -S {AGENT} serve; else echo missing; fi"


def line(event: str, host: str, start: float, seconds: float, pid: int = 10, thread: int = 1, **fields) -> str:
    return json.dumps(
        {
            "event": event,
            "host": host,
            "start": 1000.0 + start,
            "seconds": seconds,
            "pid": pid,
            "thread": thread,
            **fields,
        }
    )


def synthetic(path: Path) -> Path:
    """One `up` (pid 10) on two hosts, one thread each, and a watcher (pid 99) writing to the same file.
    Lines are in the order spans end, as tfctl appends them."""
    path.write_text(
        "\n".join(
            [
                line("transport.connect", "a", 0.10, 0.30),
                line("transport.stream", "a", 0.05, 0.40, command=SERVE),
                line("transport.connect", "b", 0.10, 0.50, thread=2),
                line(
                    "transport.run", "b", 0.70, 0.10, thread=2, command="umask 077 && mkdir -p -- ~/.tfctl && cat > x"
                ),
                line("transport.put", "b", 0.69, 0.12, thread=2, path=AGENT, bytes=900),
                line("agent.ship", "b", 0.68, 0.14, thread=2),
                line("agent.info", "a", 0.00, 0.60),  # 0.40 of it opening the stream (0.30 of which the handshake)
                line("transport.stream", "b", 0.05, 0.60, thread=2, command=SERVE),
                line("agent.info", "b", 0.00, 1.00, thread=2),
                line("agent.ports", "a", 1.10, 0.05),
                line("spawn_watcher", "", 1.20, 0.20),
                line("transport.connect", "a", 2.00, 0.30, pid=99),
            ]
        )
        + "\n"
    )
    return path


def test_read_keeps_one_process_in_start_order(tmp_path):
    spans = tracefile.read(synthetic(tmp_path / "t.jsonl"), pid=10)
    assert len(spans) == 11 and all(s.pid == 10 for s in spans)
    assert [s.start for s in spans] == sorted(s.start for s in spans)
    assert len(tracefile.read(tmp_path / "t.jsonl")) == 12


def test_summary_counts_and_nets_out_what_a_span_waited_on(tmp_path):
    s = tracefile.summarize(tracefile.read(synthetic(tmp_path / "t.jsonl"), pid=10))
    assert (len(s.connects), len(s.channels), len(s.calls)) == (2, 3, 3)
    rows = {(r.kind, r.label): r.times for r in s.rows}
    (net_a, gross_a), (net_b, gross_b) = rows[("supervisor call", "info")]
    assert (gross_a, net_a) == (0.60, pytest.approx(0.20))  # without its stream (and the handshake inside)
    # b: the stream before it (0.60, handshake inside) and the upload's channel (0.10) are out
    assert net_b == pytest.approx(0.30)
    assert rows[("agent upload", "ship")] == [(pytest.approx(0.04), 0.14)]
    assert rows[("stream opened", "serve")] == [(pytest.approx(0.10), 0.40), (pytest.approx(0.10), 0.60)]
    assert rows[("exec channel", "put")] == [(pytest.approx(0.10), 0.10)]
    assert rows[("file put", AGENT)] == [(pytest.approx(0.12), 0.12)]
    assert s.calls_per_host == {"a": ["info", "ports"], "b": ["info"]}
    assert s.channels_per_host == {"a": ["serve"], "b": ["serve", "put"]}
    assert s.steps == {"spawn_watcher": 0.20}
    assert (s.first, s.last) == (1000.0, pytest.approx(1001.40))
    assert [r.kind for r in s.rows][:2] == ["supervisor call"] * 2 and s.rows[0].label == "info"


def test_command_labels():
    assert tracefile.command_label(SERVE) == "serve"
    assert tracefile.command_label(f"python3 -I -S {AGENT} follow") == "follow"
    assert tracefile.command_label(f"test -f {AGENT}") == "test -f agent"
    assert tracefile.command_label("true") == "true"


# -- bench/report.py ---------------------------------------------------------------------------


def test_trace_tables_render_a_synthetic_trace(tmp_path):
    s = tracefile.summarize(tracefile.read(synthetic(tmp_path / "t.jsonl"), pid=10))
    sample = Sample(wall=2.0, cpu=0.5, pid=10, spawned=999.7)
    out: list[str] = []
    report.trace_tables(2, ["a", "b"], {"up": report.Traced(sample, s)}, "HEAD", out.append)
    text = "\n".join(out)
    assert "| up | 2.00 | 0.30 / 1.40 / 0.30 | 0.50 | 2 | 0.40 / 0.50 | 3 | 3 | 2 / 1 | 1 / 2 |" in text
    assert "| up: supervisor call `info` | 2 | 0.250 | 0.300 | 0.50 | 0.800 |" in text
    assert "up on b: supervisor calls: info; SSH commands: serve, put" in text
    assert "up: handshakes from 0.40s to 0.90s after spawning the process; spawn_watcher 0.20s" in text


def test_up_breakdown_cuts_at_progress_lines():
    lines = [
        (0.30, "[  0.0s] cluster fanout2: 3 tasks"),
        (0.90, "[  0.6s] tfh1        ok: python 3.11"),
        (1.40, "[  1.1s] all 3 tasks running"),
    ]
    steps: dict[str, tuple[object, ...]] = {
        name: (stamp, at, step) for name, stamp, at, step, _ in report.up_breakdown(lines, 2, 2.0)
    }
    assert steps["tfctl started"] == (None, 0.30, 0.30)
    assert steps["all hosts connected"] == (0.6, 0.90, pytest.approx(0.60))
    assert steps["all running"] == (1.1, 1.40, pytest.approx(0.50))
    assert steps["process exit"] == (None, 2.0, pytest.approx(0.60))
    assert steps["ps running"][1] != steps["ps running"][1]  # not seen: NaN
