"""Command line: parse arguments, call lifecycle, render (`render.py`). Nothing else lives here.

One module per group of verbs; importing them registers them on the `cli` group.
`-f/--file` names the cluster file before the verb (`tfctl -f FILE logs -f`, as in docker
compose) or after it on every verb but `logs`, where `-f` means follow.
"""

from tfctl.cli import history, inspect, prepare, reach, start, stop
from tfctl.cli.app import cli, main

__all__ = ["cli", "main", "history", "inspect", "prepare", "reach", "start", "stop"]
