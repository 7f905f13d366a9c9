"""The one place output is configured: rich consoles for humans, plain text for pipes.

rich is imported on first use only, so `tfctl --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console


def color_enabled(stream: TextIO) -> bool:
    """NO_COLOR (https://no-color.org) wins, then FORCE_COLOR; else colour only on a terminal
    that is not `TERM=dumb`."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR", "0") not in ("", "0"):
        return True
    return stream.isatty() and os.environ.get("TERM") != "dumb"


@lru_cache(maxsize=None)
def out() -> Console:
    """stdout: tables, JSON, log lines."""
    from rich.console import Console

    # Piped output is read by scripts and pagers: don't cut it to an imaginary 80-column screen.
    width = None if sys.stdout.isatty() else 200
    return Console(no_color=not color_enabled(sys.stdout), highlight=False, soft_wrap=True, width=width)


@lru_cache(maxsize=None)
def err() -> Console:
    """stderr: progress, warnings and errors, so stdout stays clean for pipes."""
    from rich.console import Console

    return Console(stderr=True, no_color=not color_enabled(sys.stderr), highlight=False, soft_wrap=True)
