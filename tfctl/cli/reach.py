"""`tfctl ssh`, `tfctl exec` and `tfctl tensorboard`: reaching a run's tasks where they run."""

from __future__ import annotations

from pathlib import Path

import click

from tfctl.cli.app import cli
from tfctl.cli.common import file_option, run_record, run_store, select_task
from tfctl.cli.complete import run_option, task_names
from tfctl.errors import UsageError


@cli.command(
    short_help="Open a shell where a task runs, with its environment.",
    epilog="""\b
Examples:
  tfctl ssh worker:1           a shell on worker:1's host, in its workdir
  tfctl ssh chief --run ID     the chief of an earlier run""",
)
@file_option()
@run_option
@click.argument("task", shell_complete=task_names)
@click.pass_context
def ssh(ctx: click.Context, cluster_file: Path | None, run_id: str | None, task: str) -> int:
    """Open a shell on TASK's host, in its working directory, with its environment.

    TASK is `job:index`, or `job` when that job has one task. The shell has the task's
    TF_CONFIG and the cluster file's `env`; its exit code is tfctl's.
    """
    from tfctl.cluster import reach

    record = run_record(ctx, cluster_file, run_id, resume=False)
    return reach.attach(record, select_task(record, task), None)


@cli.command(
    name="exec",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    short_help="Run a command where a task runs; its exit code is tfctl's.",
    epilog="""\b
Examples:
  tfctl exec worker:1 -- nvidia-smi
  tfctl exec ps -- sh -c 'echo "$TF_CONFIG"'""",
)
@file_option()
@run_option
@click.argument("task", shell_complete=task_names)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def exec_command(
    ctx: click.Context, cluster_file: Path | None, run_id: str | None, task: str, command: tuple[str, ...]
) -> int:
    """Run COMMAND on TASK's host, in its working directory, with its environment.

    Options go before TASK; TASK is `job:index`, or `job` when that job has one task. Each
    word of COMMAND reaches the host as one word, exactly as written (use `sh -c '...'` for
    pipes and variables). Output streams as it comes; a pipe or file on stdin is passed on (a
    terminal's keystrokes are not: use `tfctl ssh`); the exit code is the command's.
    """
    from tfctl.cluster import reach

    argv = command[1:] if command[0] == "--" else command
    if not argv:
        raise UsageError("no command to run", hint=f"write it after `--`: tfctl exec {task} -- COMMAND")
    record = run_record(ctx, cluster_file, run_id, resume=False)
    return reach.attach(record, select_task(record, task), argv)


@cli.command(
    short_help="Serve the run's logdir with TensorBoard, forwarded here.",
    epilog="""\b
Examples:
  tfctl tensorboard             the newest run, on http://127.0.0.1:6006/
  tfctl tensorboard --port 8080 --run ID""",
)
@file_option()
@run_option
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=6006,
    show_default=True,
    help="Local port to forward (another, free one if it is in use).",
)
@click.pass_context
def tensorboard(ctx: click.Context, cluster_file: Path | None, run_id: str | None, port: int) -> int:
    """Start TensorBoard over the run's `logdir` on the chief's host and forward a local port to it.

    Runs until Ctrl-C, or until the run ends if it is live; then stops TensorBoard on its host
    and checks that it is gone.
    """
    from tfctl import console
    from tfctl.tf import tensorboard as board

    err = console.err()
    record = run_record(ctx, cluster_file, run_id)

    def started(s: board.Started) -> None:
        if s.local_port_taken:
            err.print(f"port {port} is in use here; forwarding port {s.local_port} instead", markup=False)
        err.print(
            f"TensorBoard for run {record.run_id} on {s.host} (the host of {s.task}; pid {s.pid}, "
            f"port {s.remote_port} there), logdir {s.logdir}",
            markup=False,
        )
        console.out().print(s.url, markup=False)
        err.print("Ctrl-C stops it" + (", as does the end of the run" if record.active else ""), markup=False)

    stopped = board.serve(run_store(), record, port, started, lambda m: err.print(f"warning: {m}", markup=False))
    left = (
        f"{len(stopped.remaining)} remain: pids {', '.join(map(str, stopped.remaining))}"
        if stopped.remaining
        else "0 remain"
    )
    port_state = "its port is closed" if stopped.port_holder is None else f"its port is held by {stopped.port_holder}"
    err.print(
        f"{stopped.why}: TensorBoard stopped on {stopped.host} ({stopped.processes} processes; {left}; {port_state})",
        markup=False,
    )
    return 0 if stopped.clean and not stopped.why.startswith("TensorBoard ended") else 1
