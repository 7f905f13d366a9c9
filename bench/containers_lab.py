"""A podman of the suite's own: its containers.conf, its image store, and a small image with no
registry (Debian's essential packages and python3-minimal, by mmdebstrap, then `podman import`).

Configured through CONTAINERS_CONF and CONTAINERS_STORAGE_CONF alone, never the machine's files:
runc (crun refuses these cgroup v1 machines: "cgroups in hybrid mode not supported"), cgroupfs,
and ulimits within the hard limits (podman's default nofile is above them here).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

IMAGE = "localhost/tfctl-test:py3"
NEEDED = ("podman", "runc", "mmdebstrap")


def skip_reason() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "the podman lab needs root (mmdebstrap and a rootful podman)"
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing: apt-get install podman runc mmdebstrap"
    return None


class PodmanLab:
    """Paths and environment of the suite's podman under `base`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.graph = base / "storage"
        self.runroot = base / "run"
        self.env = {
            "CONTAINERS_CONF": str(base / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(base / "storage.conf"),
        }

    def podman(self, *args: str, timeout: float = 60) -> str:
        """podman with the lab's configuration; its output."""
        done = subprocess.run(
            ["podman", "--root", str(self.graph), "--runroot", str(self.runroot), *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def containers(self, label: str) -> list[str]:
        """Names of every container (running or not) with this label."""
        return self.podman("ps", "--all", "--filter", f"label={label}", "--format", "{{.Names}}").split()

    def build(self) -> float:
        """Write the configuration and import the image; the seconds it took."""
        began = time.monotonic()
        self.base.mkdir(parents=True, exist_ok=True)
        _soft, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
        nproc = 4096 if nproc == resource.RLIM_INFINITY else min(nproc, 4096)
        (self.base / "containers.conf").write_text(
            "[containers]\n"
            f'default_ulimits = ["nofile=1024:1024", "nproc={nproc}:{nproc}"]\n'
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'runtime = "runc"\n'
            'events_logger = "file"\n'
        )
        (self.base / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{self.graph}"\nrunroot = "{self.runroot}"\n'
        )
        tarball = self.base / "rootfs.tar"
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=essential",
                "--include=python3-minimal,libpython3.11-stdlib",
                "bookworm",
                str(tarball),
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
        self.podman("import", str(tarball), IMAGE, timeout=300)
        tarball.unlink()
        return time.monotonic() - began

    def tear_down(self) -> None:
        """Remove every container and image of the lab, then its files."""
        try:
            self.podman("rm", "--all", "--force")
            self.podman("rmi", "--all", "--force")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
