"""The one place output is configured: rich consoles for humans, plain text for pipes.

Colour is decided here only (`color_enabled`), for rich's output and for the log prefixes alike:
rich's own reading of FORCE_COLOR and TERM differs from ours, so the consoles are told exactly.
rich is imported on first use only, so `tfctl --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Literal, TextIO

if TYPE_CHECKING:
    from rich.console import Console

# One colour per task prefix, in this order; rich colour names, rendered as ANSI's 16 colours.
PALETTE = (
    "cyan",
    "yellow",
    "magenta",
    "green",
    "blue",
    "bright_red",
    "bright_cyan",
    "bright_yellow",
    "bright_magenta",
    "bright_green",
    "bright_blue",
)


def color_enabled(stream: TextIO) -> bool:
    """NO_COLOR (https://no-color.org: any non-empty value) wins, then FORCE_COLOR (any value but
    empty or `0`, even into a pipe); else colour only on a terminal that is not `TERM=dumb`."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR", "0") not in ("", "0"):
        return True
    return _is_tty(stream) and os.environ.get("TERM") != "dumb"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except ValueError:  # closed
        return False


def make_console(stream: TextIO | None = None, *, stderr: bool = False, width: int | None = None) -> Console:
    """A rich console on `stream` (default: whatever sys.stdout, or with `stderr` sys.stderr, is
    when it writes) that colours exactly when `color_enabled` says so.

    Whether it is a terminal (spinners, live tables) follows the stream alone, so FORCE_COLOR
    colours piped output without animating it; forced colour uses the 16 ANSI colours, which
    every terminal and pager (`less -R`) shows."""
    from rich.console import Console

    target = stream or (sys.stderr if stderr else sys.stdout)
    tty = _is_tty(target)
    color = color_enabled(target)
    system: Literal["auto", "standard"] | None = None
    if color:
        system = "auto" if tty and os.environ.get("TERM") != "dumb" else "standard"
    return Console(
        file=stream,
        stderr=stderr,
        force_terminal=tty,
        color_system=system,
        no_color=not color,
        highlight=False,
        soft_wrap=True,
        width=width,
    )


@lru_cache(maxsize=None)
def out() -> Console:
    """stdout: tables, JSON, log lines."""
    # Piped output is read by scripts and pagers: don't cut it to an imaginary 80-column screen.
    return make_console(width=None if _is_tty(sys.stdout) else 200)


@lru_cache(maxsize=None)
def err() -> Console:
    """stderr: progress, warnings and errors, so stdout stays clean for pipes."""
    return make_console(stderr=True)


def paint(text: str, color: str) -> str:
    """`text` in rich colour `color` as ANSI codes: for lines written without rich (task output,
    hundreds of thousands of lines), whose caller asked `color_enabled` first."""
    from rich.color import ColorSystem
    from rich.style import Style

    return Style(color=color).render(text, color_system=ColorSystem.STANDARD)
