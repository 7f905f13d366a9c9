"""Command line: parse arguments, call the controller, render (`render.py`). Nothing else lives here.

One module per group of verbs; importing them registers them on the `cli` group.
`-f/--file` names the cluster file before the verb (`tfctl -f FILE logs -f`, as in docker
compose) or after it, on every verb that reads one; after `logs`, `-f` means follow (use
`--file`). `init` takes a directory instead.
"""

from tfctl.cli import export, history, inspect, pool, prepare, queue, reach, start, stop, sweep, top
from tfctl.cli.app import cli, main

__all__ = [
    "cli",
    "main",
    "export",
    "history",
    "inspect",
    "pool",
    "prepare",
    "queue",
    "reach",
    "start",
    "stop",
    "sweep",
    "top",
]
