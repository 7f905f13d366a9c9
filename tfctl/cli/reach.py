"""`tfctl ssh` and `tfctl exec`: reaching a run's tasks where they run."""

from __future__ import annotations

from pathlib import Path

import click

from tfctl.cli.app import cli
from tfctl.cli.common import file_option, run_record, select_task
from tfctl.errors import UsageError

RUN_HELP = "Run id (default: the newest run of the cluster file)."


@cli.command()
@file_option()
@click.option("--run", "run_id", help=RUN_HELP)
@click.argument("task")
@click.pass_context
def ssh(ctx: click.Context, cluster_file: Path | None, run_id: str | None, task: str) -> int:
    """Open a shell on TASK's host, in its working directory, with its environment.

    TASK is `job:index`, or `job` when that job has one task. The shell has the task's
    TF_CONFIG and the cluster file's `env`; its exit code is tfctl's.
    """
    from tfctl import reach

    record = run_record(ctx, cluster_file, run_id, resume=False)
    return reach.attach(record, select_task(record, task), None)


@cli.command(name="exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@file_option()
@click.option("--run", "run_id", help=RUN_HELP)
@click.argument("task")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def exec_command(
    ctx: click.Context, cluster_file: Path | None, run_id: str | None, task: str, command: tuple[str, ...]
) -> int:
    """Run COMMAND on TASK's host, in its working directory, with its environment.

    \b
    tfctl exec worker:1 -- nvidia-smi
    tfctl exec worker:1 -- sh -c 'echo "$TF_CONFIG"'

    Options go before TASK; TASK is `job:index`, or `job` when that job has one task. Each
    word of COMMAND reaches the host as one word, exactly as written (use `sh -c '...'` for
    pipes and variables). Output streams as it comes; a pipe or file on stdin is passed on (a
    terminal's keystrokes are not: use `tfctl ssh`); the exit code is the command's.
    """
    from tfctl import reach

    argv = command[1:] if command[0] == "--" else command
    if not argv:
        raise UsageError("no command to run", hint=f"write it after `--`: tfctl exec {task} -- COMMAND")
    record = run_record(ctx, cluster_file, run_id, resume=False)
    return reach.attach(record, select_task(record, task), argv)
