"""Reading a tfctl trace file (`TFCTL_TRACE`, see tfctl/trace.py) into what one command did.

tfctl appends one JSON line per span when it ends: `transport.connect` (an SSH handshake),
`transport.run` / `transport.stream` (an exec channel; a stream's span ends once its channel is
open), `transport.put`, `agent.<verb>` (a supervisor call) and `agent.ship` (the agent upload).
Spans of one thread nest, so a span's net time is its own: without the inner spans it waited on.
Other events are kept as named steps, so new spans show up in the report without changes here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

SLACK = 1e-4  # seconds: starts are wall-clock, durations perf_counter; allow them to disagree a little


@dataclass(frozen=True)
class Span:
    event: str
    host: str
    start: float  # epoch seconds
    seconds: float
    pid: int
    thread: int
    fields: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def end(self) -> float:
        return self.start + self.seconds

    def contains(self, other: Span) -> bool:
        return (
            other is not self
            and other.pid == self.pid
            and other.thread == self.thread
            and self.start - SLACK <= other.start < self.end
            and other.end <= self.end + SLACK
        )

    @property
    def label(self) -> str:
        """What the span was about: the agent verb, or what an SSH command line is."""
        if self.event.startswith("agent."):
            return self.event.removeprefix("agent.")
        if self.event == "transport.put":
            return str(self.fields.get("path", ""))
        return command_label(str(self.fields.get("command", "")))


def command_label(command: str) -> str:
    """An SSH command line as a verb: the agent verb it runs, the presence probe or the upload."""
    if command.startswith("test -f "):
        return "test -f agent"
    if command.startswith("umask 077"):
        return "put"
    m = re.search(r"(?:agent[^ ]*\.py|supervisor-[0-9a-f]+\.pyz)'? (\w+)", command)
    return m.group(1) if m else command[:30]


def read(path: Path, pid: int | None = None, helper: int | None = None, until: float = 0.0) -> list[Span]:
    """The spans in a trace file, of one process only if `pid` is given (a detached watcher
    inherits TFCTL_TRACE and appends to the same file), plus those of process `helper` that
    ended by `until` (epoch): what the watcher that `up -d` starts did for it, starting the run."""
    spans = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        helped = helper is not None and d.get("pid") == helper and d["start"] + d["seconds"] <= until
        if pid is not None and d.get("pid") != pid and not helped:
            continue
        core = {k: d.pop(k) for k in ("event", "host", "start", "seconds", "pid", "thread")}
        spans.append(Span(**core, fields=d))
    return sorted(spans, key=lambda s: s.start)


def net(span: Span, inner: Iterable[Span]) -> float:
    """`span`'s duration without the outermost of the `inner` spans nested in it."""
    nested = [i for i in inner if span.contains(i)]
    return span.seconds - sum(i.seconds for i in nested if not any(o.contains(i) for o in nested))


@dataclass
class Row:
    """Every span of one kind and label: (net, gross) seconds each."""

    kind: str
    label: str
    times: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class Summary:
    connects: list[Span]
    channels: list[Span]  # transport.run and transport.stream
    calls: list[Span]  # agent.<verb>, not agent.ship
    rows: list[Row]  # per kind and label, the most time first
    calls_per_host: dict[str, list[str]]  # agent verbs in the order they started
    channels_per_host: dict[str, list[str]]
    steps: dict[str, float]  # any other event: total seconds
    first: float  # epoch seconds: start of the first span, end of the last
    last: float


KINDS = {
    "agent.<verb>": "supervisor call",
    "agent.ship": "agent upload",
    "transport.run": "exec channel",
    "transport.stream": "stream opened",
    "transport.put": "file put",
}


def kind(span: Span) -> str:
    """The report's name for a span's event: one of KINDS' values, or the event itself."""
    if span.event.startswith("agent.") and span.event != "agent.ship":
        return KINDS["agent.<verb>"]
    return KINDS.get(span.event, span.event)


def summarize(spans: list[Span]) -> Summary:
    """Group a command's spans; net times leave out the handshakes and channels a span triggered."""
    connects = [s for s in spans if s.event == "transport.connect"]
    channels = [s for s in spans if s.event in ("transport.run", "transport.stream")]
    agent = [s for s in spans if s.event.startswith("agent.")]
    puts = [s for s in spans if s.event == "transport.put"]
    rows: dict[tuple[str, str], Row] = {}
    for group, inner in ((agent, channels + connects), (channels, connects), (puts, connects)):
        for s in group:
            rows.setdefault((kind(s), s.label), Row(kind(s), s.label)).times.append((net(s, inner), s.seconds))

    def per_host(group: list[Span]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for s in group:  # spans are sorted by start
            out.setdefault(s.host, []).append(s.label)
        return out

    steps: dict[str, float] = {}
    for s in spans:
        if not s.event.startswith(("agent.", "transport.")):
            steps[s.event] = steps.get(s.event, 0.0) + s.seconds
    order = {kind: i for i, kind in enumerate(KINDS.values())}
    calls = [s for s in agent if s.event != "agent.ship"]
    return Summary(
        connects,
        channels,
        calls,
        sorted(rows.values(), key=lambda r: (order[r.kind], -sum(g for _, g in r.times))),
        per_host(calls),
        per_host(channels),
        steps,
        min((s.start for s in spans), default=float("nan")),
        max((s.end for s in spans), default=float("nan")),
    )
