"""Notes a request's handler sends before its answer: what a slow request is doing meanwhile
(an image's pull, line by line as the runtime prints it). `serve`'s stdout is the conversation:
a note is a line of its own there, which no answer line is mistaken for (answers start with `{`)
and which a controller that does not know notes skips as it skips a shell's start-up noise."""

from __future__ import annotations

import json
import sys
import threading
from typing import Optional

PREFIX = "tfctl-note "
MOST = 200  # characters of a note: a runtime's line is the host's, of any length
_WRITING = threading.Lock()  # a runtime's stdout and stderr are read on two threads


def say(text: str) -> None:
    """Send `text` (its first MOST characters) to whoever asked, before the answer."""
    text = text.strip()
    if text:
        with _WRITING:
            sys.stdout.write(PREFIX + json.dumps(text[:MOST]) + "\n")
            sys.stdout.flush()


def heard(line: str) -> Optional[str]:
    """The note `line` carries, or None when it is none."""
    if not line.startswith(PREFIX):
        return None
    try:
        text = json.loads(line[len(PREFIX) :])
    except ValueError:
        return None
    return text[:MOST] if isinstance(text, str) else None
