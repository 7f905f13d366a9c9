"""Copying the workdir to remote hosts: only what changed since the last sync to that host.

Each host keeps a cache of the last synced tree per cluster (~/.tfctl/sync/<cluster>) with a
manifest of content hashes; tfctl asks which files the cache lacks, sends only those, and the
host copies the cache into the run's own directory, so a later sync never touches a running task.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from tfctl.cluster.agent import REMOTE_ROOT, HostAgent
from tfctl.errors import UsageError
from tfctl.supervisor.protocol import FileEntry, SyncApplyAnswer, SyncApplyRequest, SyncPlanAnswer, SyncPlanRequest

MAX_SYNC_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Manifest:
    root: Path
    files: dict[str, FileEntry]  # relative path -> content hash, size, permission bits

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())


def excluded(rel: str, patterns: Iterable[str]) -> bool:
    parts = rel.split("/")
    return any(fnmatch.fnmatch(rel, p) or any(fnmatch.fnmatch(part, p) for part in parts) for p in patterns)


def build_manifest(root: Path, exclude: Iterable[str]) -> Manifest:
    """Every regular file under `root` not matching `exclude`, with its content hash."""
    patterns = tuple(exclude)
    files: dict[str, FileEntry] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames if not excluded(d if rel_dir == "." else f"{rel_dir}/{d}", patterns))
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            path = Path(dirpath, name)
            if excluded(rel, patterns) or not path.is_file():
                continue
            data = path.read_bytes()
            files[rel] = FileEntry(hashlib.sha256(data).hexdigest(), len(data), path.stat().st_mode & 0o777)
    manifest = Manifest(root, files)
    if manifest.size > MAX_SYNC_BYTES:
        raise UsageError(
            f"workdir {root} holds {manifest.size / 2**20:.0f} MiB to copy to every host",
            hint="exclude data and checkpoints with `exclude:`, or set `sync: false` if the hosts share a filesystem",
        )
    return manifest


def cache_path(cluster: str) -> str:
    """A host's cache of the last tree synced for this cluster (shared by hosts sharing a home)."""
    return f"{REMOTE_ROOT}/sync/{cluster}"


def plan_host(agent: HostAgent, manifest: Manifest, cluster: str) -> SyncPlanAnswer:
    """What this host lacks, and which filesystem its cache is on."""
    return agent.call(SyncPlanRequest(cache_path(cluster), manifest.files))


def apply_host(agent: HostAgent, manifest: Manifest, cluster: str, dest: str, need: list[str]) -> SyncApplyAnswer:
    """Send what the host lacks and have it place the whole tree at `dest`."""
    blobs = {rel: base64.b64encode((manifest.root / rel).read_bytes()).decode() for rel in need}
    return agent.call(SyncApplyRequest(cache_path(cluster), dest, manifest.files, blobs), timeout=600)


def one_per_filesystem(filesystems: Mapping[str, str]) -> dict[str, list[str]]:
    """host to act on -> the other hosts that see its files (a shared home), from each host's
    filesystem token (empty: its own): a tree is copied, or resumed, once per filesystem."""
    groups: dict[str, list[str]] = {}
    for host, filesystem in sorted(filesystems.items()):
        groups.setdefault(filesystem or f"host:{host}", []).append(host)
    return {hosts[0]: hosts[1:] for hosts in groups.values()}
