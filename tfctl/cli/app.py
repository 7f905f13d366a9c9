"""Command line: parse arguments, call the controller, render (`render.py`). Nothing else lives here.

`-f/--file` names the cluster file before the verb (`tfctl -f FILE logs -f`, as in docker
compose) or after it, on every verb that reads one; after `logs`, `-f` means follow (use
`--file`). `init` takes a directory instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from tfctl import __version__
from tfctl.cli.common import file_option
from tfctl.engine.clock import REAL_CLOCK, Clock
from tfctl.errors import EXIT_INTERRUPTED, TfctlError, UsageError


@dataclass(frozen=True)
class Environment:
    """What the verbs meet beyond their arguments, given by whoever calls `main`: the clock
    their waits between refreshes use (`status --watch`; a test's is fake)."""

    clock: Clock = REAL_CLOCK


def environment(ctx: click.Context) -> Environment:
    return ctx.find_object(Environment) or Environment()


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Examples:
  tfctl init demo && cd demo && tfctl up  write a localhost cluster and run it
  tfctl -f gpu.yaml up -d                 start detached; prints the run id
  tfctl -f gpu.yaml logs -f               follow every task's output
  tfctl -f gpu.yaml down                  stop it and prove nothing remains
  tfctl export tfjob                      the same cluster as a Kubeflow TFJob

Shell completion (bash): eval "$(_TFCTL_COMPLETE=bash_source tfctl)"; see the docs for zsh
and fish.""",
)
@file_option()
@click.option(
    "--trace",
    "trace_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append timed events (host calls, SSH channels) to FILE as JSON lines.",
)
@click.version_option(__version__, prog_name="tfctl")
def cli(cluster_file: Path | None, trace_file: Path | None) -> None:
    """Launch, watch and stop distributed TensorFlow clusters from one cluster file."""
    # `cluster_file` is read by each verb from the parsed parameters (`common.named_file`).
    if trace_file is not None:
        os.environ["TFCTL_TRACE"] = str(trace_file.resolve())  # the detached watcher inherits it
    if click.get_current_context().invoked_subcommand not in ("_queue", "queue"):  # (`queue` does, and says so)
        _bring_back_the_queue()


def _bring_back_the_queue() -> None:
    """Runs wait in the queue but no process starts them (every tfctl process of the user was
    killed, the machine rebooted): any tfctl command starts its driver again."""
    from tfctl.controller.queue.files import ensure_driver
    from tfctl.runs.store import RunStore

    with contextlib.suppress(OSError):  # (a home it cannot use: the verb itself says so)
        ensure_driver(RunStore())


def main(env: Environment | None = None) -> None:
    """Entry point: the one place that maps errors to exit codes."""
    try:
        # One program name however tfctl was started (`python -m tfctl` too): the usage lines and
        # the shell-completion variable (_TFCTL_COMPLETE) depend on it.
        code = cli.main(prog_name="tfctl", standalone_mode=False, obj=env or Environment())
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except click.exceptions.Abort:
        code = EXIT_INTERRUPTED
    except click.ClickException as e:
        e.show()
        code = 2
    except TfctlError as e:
        code = _show(e)
    except PermissionError as e:
        home_error = _unusable_home(e)
        if home_error is None:
            raise
        code = _show(home_error)
    sys.exit(code if isinstance(code, int) else 0)


def _show(error: TfctlError) -> int:
    from rich.text import Text

    from tfctl import console

    console.err().print(Text("error: ", style="bold red") + Text(error.message))
    if error.hint:
        console.err().print(Text("hint: ", style="bold") + Text(error.hint))
    return error.exit_code


def _unusable_home(error: PermissionError) -> UsageError | None:
    """tfctl's own directory (TFCTL_HOME) that this user cannot read or write: a setup mistake
    to name with its fix, not a traceback. None for any other path."""
    from tfctl.config.home import tfctl_home

    home = tfctl_home()
    path = Path(str(error.filename or ""))
    if path != home and home not in path.parents:
        return None
    return UsageError(
        f"cannot use tfctl's directory {home}: {error.strerror} ({path})",
        hint=f"make it yours (chown -R $USER {home}; chmod 700 {home}), or set TFCTL_HOME to a directory you own",
    )
