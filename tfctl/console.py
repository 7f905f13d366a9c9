"""The one place output is configured: rich consoles for humans, plain text for pipes.

Colour is decided here only (`color_enabled`), for rich's output and for the log prefixes alike:
rich's own reading of FORCE_COLOR and TERM differs from ours, so the consoles are told exactly.
rich is imported on first use only, so `tfctl --help` stays fast.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.segment import Segment

# Piped output is read by scripts and pagers: don't cut it to an imaginary 80-column screen.
OUT_PIPE_WIDTH = 200

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
    target = stream or (sys.stderr if stderr else sys.stdout)
    return _console(stream, stderr, width, _is_tty(target), color_enabled(target))


def _console(stream: TextIO | None, stderr: bool, width: int | None, tty: bool, color: bool) -> Console:
    system: Literal["auto", "standard"] | None = None
    if color:
        system = "auto" if tty and os.environ.get("TERM") != "dumb" else "standard"
    return _inert_console_class()(
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
def _inert_console_class() -> type[Console]:
    """rich's Console, but every piece of text it writes passes `inert_lines` (its own control
    segments, cursor moves of a live display, stay) and no text becomes a hyperlink: the one
    boundary between what tasks and commands printed and the terminal, whoever quotes it."""
    from rich.console import Console
    from rich.segment import Segment

    class InertConsole(Console):
        def _render_buffer(self, buffer: Iterable[Segment]) -> str:
            return super()._render_buffer(
                segment if segment.control else Segment(inert_lines(segment.text), _unlinked(segment.style))
                for segment in buffer
            )

    return InertConsole


def _unlinked(style: Any) -> Any:
    return style.update_link(None) if style is not None and style.link else style


def stdout_traits() -> dict[str, Any]:
    """What `out()` would make of stdout, for another process to render exactly as it would."""
    tty = _is_tty(sys.stdout)
    return {
        "tty": tty,
        "color": color_enabled(sys.stdout),
        "width": shutil.get_terminal_size().columns if tty else OUT_PIPE_WIDTH,
    }


def rendered(renderable: Any, traits: Mapping[str, Any]) -> str:
    """`renderable` as a console with these `stdout_traits` would print it."""
    buffer = io.StringIO()
    _console(buffer, False, int(traits["width"]), bool(traits["tty"]), bool(traits["color"])).print(renderable)
    return buffer.getvalue()


@lru_cache(maxsize=None)
def out() -> Console:
    """stdout: tables, JSON, log lines."""
    return make_console(width=None if _is_tty(sys.stdout) else OUT_PIPE_WIDTH)


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


# Task output is untrusted: on a terminal, a control sequence a task prints could set the window
# title, write the clipboard (OSC 52), clear the screen or move the cursor over tfctl's own lines,
# and a bidirectional override (U+202A-202E, U+2066-2069) could show text in another order than
# it is. `inert` shows every such character as `cat -v` does (ESC as ^[, BEL as ^G; an override
# as <U+202E>), so nothing reaches the terminal as a command and no sequence is ever cut in half;
# SGR colour sequences may be kept, with a reset at the end of the line so a colour never leaks
# into the next. Every rich console (`make_console`, `rendered`) passes the text it prints through
# the same filter, so whatever tfctl quotes of a task or a command is shown, never obeyed.
_SGR = re.compile(r"\x1b\[[0-9;:]*m")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x80-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_IN_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f\u202a-\u202e\u2066-\u2069]")  # newlines are fine


def has_controls(text: str) -> bool:
    """Whether lines joined by newlines hold anything `inert` would change: one C-speed scan of
    a whole block, so clean output pays no per-line work."""
    return _UNSAFE_IN_LINES.search(text) is not None


def _caret(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code > 0xFF:
        return f"<U+{code:04X}>"
    if code >= 0x80:
        return "M-^" + chr(code - 0x80 + 0x40)
    return "^?" if code == 0x7F else "^" + chr(code + 0x40)


def inert(line: str, keep_colour: bool = False) -> str:
    """`line` with every control character shown, not obeyed (tabs stay tabs); with
    `keep_colour`, SGR colour sequences stay and the line ends with a reset."""
    if not keep_colour:
        return _CONTROL.sub(_caret, line) if _CONTROL.search(line) else line
    parts = _SGR.split(line)
    colours = _SGR.findall(line)
    if not colours:
        return _CONTROL.sub(_caret, line) if _CONTROL.search(line) else line
    out = [_CONTROL.sub(_caret, parts[0])]
    for colour, part in zip(colours, parts[1:]):
        out += [colour, _CONTROL.sub(_caret, part)]
    return "".join(out) + "\x1b[0m"


def shown(text: str) -> str:
    """Text rendered elsewhere (the status table a run's controller rendered for this terminal)
    as it may reach the terminal: its SGR colours kept, every other control shown, not obeyed."""
    if not has_controls(_SGR.sub("", text)):
        return text
    parts, colours = _SGR.split(text), _SGR.findall(text)
    return "".join(inert_lines(part) + colour for part, colour in zip(parts, [*colours, ""]))


def inert_lines(text: str) -> str:
    """`inert` for text of many lines: newlines and tabs stay, every other control is shown."""
    return _UNSAFE_IN_LINES.sub(_caret, text) if _UNSAFE_IN_LINES.search(text) else text
