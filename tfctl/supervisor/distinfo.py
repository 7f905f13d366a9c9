"""Which version of a distribution an interpreter has, read from its metadata files the way
`importlib.metadata` finds them, without importing it: that import alone takes ~20 ms, in front of
every `up`. Importable on its own: `checks` also runs it in the tasks' interpreter when that is
not the supervisor's.
"""

from __future__ import annotations

import os
import re
from typing import List, Optional, Sequence, Tuple


def dist_version(names: Sequence[str], paths: Sequence[str]) -> Optional[str]:
    """'name version' of the first of `names` installed in `paths` (searched in order), else None."""
    found: List[Tuple[str, str]] = []  # (normalized name, metadata path), in path order
    for path in paths:
        try:
            entries = os.listdir(path or ".")
        except OSError:
            continue
        for entry in entries:
            stem, _, kind = entry.rpartition(".")
            if kind in ("dist-info", "egg-info"):
                found.append((_normalized(stem.split("-")[0]), os.path.join(path, entry)))
    for name in names:
        wanted = _normalized(name)
        for key, meta in found:
            version = _version(meta) if key == wanted else None
            if version:
                return "%s %s" % (name, version)
    return None


def _normalized(name: str) -> str:
    """PEP 503's name normalization, with `_` as metadata directories spell it."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _version(meta: str) -> Optional[str]:
    """The Version header of a .dist-info or .egg-info directory (or of an .egg-info file)."""
    for candidate in (os.path.join(meta, "METADATA"), os.path.join(meta, "PKG-INFO"), meta):
        try:
            with open(candidate, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line[len("Version:") :].strip()
                    if not line.strip():
                        break  # the headers ended
        except OSError:
            continue
    return None
