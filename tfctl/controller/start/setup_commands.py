"""`setup:` commands: run once per workdir (once per host, or once for hosts that share it), after
sync and before any task, in the run's workdir there.

On each host the commands run in one `/bin/sh`, one after the other, so what one does for the
next (`cd`, `. .venv/bin/activate`, `export`) carries over; the first that fails ends that host's
setup. The shell runs as a task of the run (`setup:<n>`, one per host) under the host's
supervisor: it has the run's marker, so `down` and the clean-up after a failed start stop it,
and its output is read by byte offset like any task's. tfctl fills nothing into the commands.
"""

from __future__ import annotations

import collections
import secrets
import shlex
import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from tfctl.cluster.cluster import Cluster, Progress
from tfctl.cluster.control import stop_after_failure
from tfctl.cluster.output import LogFollower
from tfctl.engine.observed import TaskStatus
from tfctl.errors import StartupError
from tfctl.runs.record import HostSpec, TaskSpec
from tfctl.supervisor.protocol import TaskState

JOB = "setup"
TAIL_LINES = 10  # of a failed setup's output, in the error
STATUS_EVERY = 2.0  # seconds between checks that every host still answers


@dataclass(frozen=True)
class Setup:
    """The setup of one run: the commands, and the task that runs them on each host."""

    commands: tuple[str, ...]
    tasks: tuple[TaskSpec, ...]
    mark: str  # starts the line announcing each command: `<mark> <index>`


def plan_setup(commands: Sequence[str], hosts: Sequence[str], cwd_for: dict[str, str], env: dict[str, str]) -> Setup:
    """One setup task per host: a shell script that announces each command with a marker line
    (a random token, so no output can be taken for one) and stops at the first that fails."""
    mark = f"tfctl-setup-{secrets.token_hex(8)}"
    lines = []
    for i, command in enumerate(commands):
        lines.append(f"echo {mark} {i}")
        lines.append(f"eval {shlex.quote(command)} || exit $?")
    script = "\n".join(lines)
    tasks = tuple(TaskSpec(JOB, i, host, 0, script, dict(env), cwd_for[host]) for i, host in enumerate(sorted(hosts)))
    return Setup(tuple(commands), tasks, mark)


def once_per_workdir(
    setup: Setup, hosts: Sequence[HostSpec], filesystems: Mapping[str, str]
) -> tuple[Setup, dict[str, list[str]]]:
    """The setup with one task per workdir, and setup host -> the hosts that share its workdir.

    Hosts that see one workdir (the synced copy on a shared home, an HPC cluster's shared
    filesystem) set it up once: installs into one virtualenv from several hosts at a time
    clash. `filesystems` has each host's root token (`HostInfo.filesystem`); a workdir outside
    the root of a host that does not share this machine's files may be its own, so it gets its own.
    """
    spec = {h.name: h for h in hosts}
    groups: dict[tuple[str, str], list[TaskSpec]] = {}
    for t in setup.tasks:
        host = spec[t.host]
        shared = host.shares_files or (t.cwd or "").startswith(host.root.rstrip("/") + "/")
        key = (filesystems.get(t.host) or f"host:{t.host}", t.cwd or "") if shared else (f"host:{t.host}", "")
        groups.setdefault(key, []).append(t)
    tasks = [group[0] for group in groups.values()]
    return replace(setup, tasks=tuple(tasks)), {g[0].host: [t.host for t in g[1:]] for g in groups.values()}


def run_setup(cluster: Cluster, setup: Setup, progress: Progress) -> None:
    """Run the setup tasks on their hosts at once, showing their output live, host by host.

    Returns when every host's setup succeeded. Otherwise (a command failed, a host stopped
    answering for `host_timeout`, Ctrl-C) stops what still runs and raises, naming each host that
    failed, its command, how it ended and its last lines.
    """
    tasks, commands, mark = setup.tasks, setup.commands, setup.mark + " "
    hosts = {t.name: t.host for t in tasks}
    step: dict[str, int | None] = {t.name: None for t in tasks}
    tails = {t.name: collections.deque[str](maxlen=TAIL_LINES) for t in tasks}
    for t in tasks:
        progress(t.host, f"setup: {len(commands)} command{'s' if len(commands) != 1 else ''} in {t.cwd}")
    try:
        cluster.start_tasks(tasks)
        with LogFollower(cluster, tasks, follow=True) as follower:
            failed: list[TaskStatus] = []
            silent: dict[str, float] = {}
            seen_ended: set[str] = set()
            checked = time.monotonic()
            for batch in follower.batches():
                for name, line in batch:
                    if line.startswith(mark) and line[len(mark) :].isdigit():
                        index = step[name] = int(line[len(mark) :])
                        progress(hosts[name], f"$ {commands[index]}")
                    else:
                        tails[name].append(line)
                        progress(hosts[name], line)
                if failed and not batch:  # their last lines are in: report them
                    break
                if time.monotonic() - checked > STATUS_EVERY or follower.ended != seen_ended:
                    checked, seen_ended = time.monotonic(), set(follower.ended)
                    failed = _failures(cluster, tasks, seen_ended, silent)
            else:
                failed = _failures(cluster, tasks, {t.name for t in tasks}, silent)
        if failed:
            ends = [(s.host, _what(s, step[s.task], commands), _tail(tails[s.task])) for s in failed]
            if len(ends) == 1:
                ((host, what, tail),) = ends
                message = f"setup failed on {host}: {what}{tail}"
            else:
                message = f"setup failed on {len(ends)} hosts:" + "".join(f"\n{h}: {w}{t}" for h, w, t in ends)
            raise StartupError(message, hint="fix the command or the host, then `tfctl up` again; no task was started")
        for t in tasks:
            progress(t.host, "setup done")
    except BaseException:
        stop_after_failure(cluster, progress)
        raise


def _failures(
    cluster: Cluster, tasks: Sequence[TaskSpec], ended: set[str], silent: dict[str, float]
) -> list[TaskStatus]:
    """The ended setups that did not succeed; also fails for a host silent over `host_timeout`."""
    statuses, unreachable = cluster.status(list(tasks))
    now = time.monotonic()
    for host in list(silent):
        if host not in unreachable:
            del silent[host]
    for host, error in unreachable.items():
        since = silent.setdefault(host, now)
        if now - since > cluster.record.host_timeout:
            raise StartupError(
                f"setup failed: {host} did not answer for {now - since:.0f}s: {getattr(error, 'message', error)}"
            )
    return [s for s in statuses if s.task in ended and s.final and s.state is not TaskState.SUCCEEDED]


def _what(status: TaskStatus, step: int | None, commands: Sequence[str]) -> str:
    """E.g. "`pip install -r requirements.txt` exited with code 1"."""
    return f"{f'`{commands[step]}`' if step is not None else 'the setup shell'} {status.describe_end()}"


def _tail(lines: Sequence[str]) -> str:
    if not lines:
        return " (no output)"
    head = f"last {len(lines)} lines" if len(lines) > 1 else "last line"
    return f"\n  {head}:" + "".join(f"\n    {line}" for line in lines)
