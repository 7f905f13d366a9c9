"""Every way of running tasks, by the name a cluster file's `backend:` gives it.

The one place that names the backends. Each is a package `tfctl.backends.<name>` (or any module
path given here) with two modules: `settings` (its cluster-file keys, read by `tfctl.config`) and
`backend` (its `BACKEND`, a `base.Backend`). Both load on first use only, so `tfctl --help` and
runs of one backend never import another. A new backend is one package and one line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tfctl.backends.base import Backend

DEFAULT = "ssh"
PACKAGES: dict[str, str] = {
    "ssh": "tfctl.backends.ssh",
    "slurm": "tfctl.backends.slurm",
}


def names() -> tuple[str, ...]:
    return tuple(PACKAGES)


def settings(name: str) -> ModuleType:
    """The backend's cluster-file keys: `SECTIONS`, `JOB_KEYS`, `DESCRIPTION` and `check`."""
    return importlib.import_module(f"{PACKAGES[name]}.settings")


def get(name: str) -> Backend:
    backend: Backend = importlib.import_module(f"{PACKAGES[name]}.backend").BACKEND
    return backend
