"""Every way of running tasks, by the name a cluster file's `backend:` gives it.

The one place that names the backends. Each is a package `tfctl.backends.<name>` (or any module
path given here) with two modules: `settings` (its cluster-file keys, read by `tfctl.config`) and
`backend` (its `BACKEND`, a `base.Backend`, which `base.backend_for` loads: the interface sits
above this registry, so naming its type here would loop back up). Both load on first use only, so
`tfctl --help` and runs of one backend never import another. A new backend is one package and one line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

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
