"""How the CLI shows what is not the status table (`controller/views/status_table.py`): stop
summaries and task lines as they stream.

Imported by the CLI's verbs only (never at `tfctl --help`), so it may import rich at once.
"""

from __future__ import annotations

import sys

from tfctl import console
from tfctl.cluster.answers import StopReport
from tfctl.cluster.output import Prefixer
from tfctl.controller.views.status_table import finding_text, number_ranges
from tfctl.tf.doctor import LiveNotes
from tfctl.tf.noise import NoiseFolder


def stop_summary(report: StopReport) -> str:
    """What was stopped and proved; with hosts that could not be checked, it says so first, and
    what it proves holds for the hosts checked only."""
    unchecked = sorted(report.unreachable)
    checked = report.hosts - len(unchecked)
    hosts = f"{report.hosts} host{'s' if report.hosts != 1 else ''}"
    if unchecked:
        hosts = f"{checked} of {hosts} ({', '.join(unchecked)} could not be checked)"
    remain = sum(len(p) for p in report.remaining.values()) + sum(len(n) for n in report.containers_left.values())
    there = " there" if unchecked else ""
    stopped = f"{report.processes} process{'es' if report.processes != 1 else ''}"
    if report.containers:
        stopped += f" and {report.containers} container{'s' if report.containers != 1 else ''}"
    text = f"{stopped} stopped on {hosts}; {remain} remain{there}"
    if report.ended:  # else `1 process stopped` after a 3-task run reads as if two were missed
        text = f"{report.ended} task{'s' if report.ended != 1 else ''} had ended; {text}"
    if report.ports:
        word = "port" if len(report.ports) == 1 else "ports"
        text += f"; {word} {number_ranges(report.ports)} " + ("free" if not report.busy_ports else "NOT free") + there
    return text


def render_stop(report: StopReport) -> None:
    console.err().print(stop_summary(report))
    for host, pids in report.remaining.items():
        console.err().print(f"{host}: still running: pids {', '.join(map(str, pids))}", style="red", markup=False)
    for host, names in report.containers_left.items():
        console.err().print(f"{host}: containers still there: {', '.join(names)}", style="red", markup=False)
    for address, pids in report.busy_ports.items():
        console.err().print(
            f"{address}: still listening (pids {', '.join(map(str, pids)) or '?'})", style="red", markup=False
        )
    for host, why in report.unreachable.items():
        console.err().print(f"{host}: could not be checked: {why}", style="red", markup=False)
    for host, why in report.lost_silent.items():
        console.err().print(
            f"{host}, which the run left when its tasks moved to a spare, is still silent ({why}): "
            "should it come back with them, `tfctl down` again stops them",
            markup=False,
        )


def print_lines(
    batch: list[tuple[str, str]], prefix: Prefixer, notes: LiveNotes | None, folder: NoiseFolder | None = None
) -> None:
    """Task lines to stdout, prefixed; the explanation of a known TF pattern that lasted to stderr."""
    print_blocks([(task, [line]) for task, line in batch], prefix, notes, folder)


def print_blocks(
    blocks: list[tuple[str, list[str]]], prefix: Prefixer, notes: LiveNotes | None, folder: NoiseFolder | None = None
) -> None:
    """`print_lines` for blocks of one task's lines (`LogFollower.blocks`): no work per line
    but the notes' (the joins are C's). With a `folder`, TF's healthy noise is not shown; the
    notes still read every line."""
    shown = blocks if folder is None else [(task, folder.fold(task, lines)) for task, lines in blocks]
    sys.stdout.write(prefix.text(shown))
    if notes is not None:
        for task, lines in blocks:
            for line in lines:
                notes.feed(task, line)
    sys.stdout.flush()
    for task, finding in notes.due() if notes is not None else ():
        console.err().print(finding_text(task, finding))
