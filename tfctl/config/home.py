"""Where tfctl keeps its files on this machine (the run store, known host keys)."""

from __future__ import annotations

import os
from pathlib import Path


def tfctl_home() -> Path:
    """tfctl's own directory on this machine: $TFCTL_HOME, else ~/.tfctl."""
    return Path(os.environ.get("TFCTL_HOME") or Path.home() / ".tfctl").expanduser()
