"""A task's host as the task sees it: a shell or a command in its working directory, with its
environment (`tfctl ssh`, `tfctl exec`). The run record knows all of it, so this works on
finished runs too.

The environment is the task's own (TF_CONFIG, the cluster file's `env`), without tfctl's markers
(TFCTL_RUN_ID, TFCTL_TASK): what runs here is the user's, not the run's, and `tfctl down` must
neither count nor stop it. A task in a container is reached in that container (`podman exec`,
`docker exec`), so it sees the image's files and Python; that needs the task's container to
still run.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Mapping, Sequence

from tfctl.errors import TfctlError, UsageError
from tfctl.runs.record import RunRecord, TaskSpec
from tfctl.supervisor import containers, procfs
from tfctl.transport.base import shell_path

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
USER_SHELL = '"${SHELL:-/bin/sh}"'  # the login user's shell, as sshd sets SHELL


def in_context(cwd: str | None, env: Mapping[str, str], command: str) -> str:
    """A POSIX shell line that runs `command` (already quoted) in `cwd` with `env` exported.

    Every value is quoted, so the host's shell parses none of them; a `~/` path is left for it
    to expand.
    """
    steps = [f"cd -- {shell_path(cwd)}"] if cwd else []
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise TfctlError(f"{name!r} is not an environment variable name", hint="check the cluster file's `env`")
    if env:
        steps.append("export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items()))
    return " && ".join([*steps, command])


def task_command(task: TaskSpec, argv: Sequence[str] | None) -> str:
    """`argv` (each word quoted: the user's words, never split again), or with None the user's
    shell, in the task's directory and environment. Not `exec`ed, so a shell builtin such as
    `exit 3` works as a command too."""
    command = " ".join(shlex.quote(word) for word in argv) if argv else f"exec {USER_SHELL}"
    return in_context(task.cwd, task.env, command)


def container_command(run_id: str, task: TaskSpec, argv: Sequence[str] | None, tty: bool) -> str:
    """The shell line that runs `argv` (None: a shell) in the task's running container, in its
    workdir, with its environment and without tfctl's markers (which the container has)."""
    box = task.container
    assert box is not None
    if box.runtime == "apptainer":
        raise UsageError(
            f"{task.name} runs in an apptainer container, which has no name to enter",
            hint=f"run `tfctl exec {task.name} -- apptainer exec {box.image} ...` to start another of its image",
        )
    # `auto` is the first of podman and docker the host has, as it was when the task started.
    runtime = shlex.quote(box.runtime) if box.runtime != "auto" else '"$(command -v podman || echo docker)"'
    words = ["--interactive", *(["--tty"] if tty else [])]
    for name, value in task.env.items():
        words += ["--env", f"{name}={value}"]
    words += [containers.name_for(run_id, task.name), "env"]
    for marker in (procfs.RUN_ENV, procfs.TASK_ENV, procfs.STORE_ENV):
        words += ["-u", marker]
    inner = " ".join(shlex.quote(word) for word in argv) if argv else 'exec "${SHELL:-/bin/sh}"'
    words += ["/bin/sh", "-c", inner]
    # The workdir as the host's shell expands it (`~/...`), as the monitor's was: the same path inside.
    workdir = shell_path(task.cwd or "~")
    return f"exec {runtime} exec --workdir {workdir} " + " ".join(shlex.quote(word) for word in words)


def attach(record: RunRecord, task: TaskSpec, argv: Sequence[str] | None) -> int:
    """Run `argv` where `task` runs, and return its exit code. None: the user's shell, on a
    terminal of its own when ours is one (else it reads commands from our stdin, as `ssh` does)."""
    spec = next(h for h in record.hosts if h.name == task.host)
    tty = argv is None and os.isatty(0)
    if task.container is not None:
        command = container_command(record.run_id, task, argv, tty)
    else:
        command = task_command(task, argv)
    transport = spec.connect()
    try:
        return transport.attach(command, tty=tty)
    finally:
        transport.close()
