"""Workdir sync: a per-cluster cache on the host, brought up to the controller's manifest.

The cache keeps the last synced tree per cluster, so only changed files cross the network; each
run still gets its own copy, so a later sync never changes a running task's files. Hosts that
share a home see one cache and one copy: `sync_plan` names the filesystem (a token file under the
root, made once by whichever host gets there first), and the controller syncs one host of each.
"""

from __future__ import annotations

import base64
import fcntl
import os
import shutil
from typing import Any, Dict

from .errors import AgentError
from .files import read_json, unique_temp, write_json
from .protocol import SyncApplyAnswer, SyncApplyRequest, SyncPlanAnswer, SyncPlanRequest

MANIFEST = ".tfctl-manifest.json"


def read_manifest(cache: str) -> Dict[str, Any]:
    return read_json(os.path.join(cache, MANIFEST)) or {}


def filesystem_token(root: str) -> str:
    """A random token stored under `root` the first time it is asked for: hosts that answer the
    same token see the same files. (link(2) is atomic, NFS included: one host's token wins.)"""
    base = os.path.expanduser(root)
    os.makedirs(base, mode=0o700, exist_ok=True)
    path = os.path.join(base, "filesystem-id")
    try:
        with open(path) as f:
            token = f.read().strip()
        if token:
            return token
    except OSError:
        pass
    tmp = unique_temp(path)
    with open(tmp, "w") as f:
        f.write(os.urandom(16).hex())  # not uuid: it imports platform, ~2 ms per start
    try:
        os.link(tmp, path)
    except OSError:
        pass  # another host (or process) made it first: theirs counts
    finally:
        os.remove(tmp)
    with open(path) as f:
        return f.read().strip()


def sync_plan(root: str, request: SyncPlanRequest) -> SyncPlanAnswer:
    """Which files of the controller's manifest this host's cache lacks or has in another version,
    and which filesystem the cache is on."""
    have = read_manifest(os.path.expanduser(request.cache))
    need = sorted(p for p, entry in request.files.items() if have.get(p, {}).get("sha") != entry.sha)
    return SyncPlanAnswer(need, filesystem_token(root))


def sync_apply(root: str, request: SyncApplyRequest) -> SyncApplyAnswer:
    """Bring the cache up to the manifest (new files from the request), then copy it to `dest`.
    One sync of a cache at a time (two trials of a sweep start together): a copy taken while
    another sync rewrites the cache would hold half of each, or fail on its temporary files."""
    cache, dest = os.path.expanduser(request.cache), os.path.expanduser(request.dest)
    os.makedirs(cache, mode=0o700, exist_ok=True)
    with open(cache + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _apply_locked(cache, dest, request)


def _apply_locked(cache: str, dest: str, request: SyncApplyRequest) -> SyncApplyAnswer:
    have = read_manifest(cache)
    changed = sorted(
        rel
        for rel, entry in request.files.items()
        if rel not in request.blobs and have.get(rel, {}).get("sha") != entry.sha
    )
    if changed:  # another sync of other versions came between this one's plan and now
        shown = ", ".join(changed[:3])
        raise AgentError(f"the host's copy of the workdir changed while this run synced it ({shown}): run `up` again")
    for rel, blob in request.blobs.items():
        target = os.path.join(cache, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = unique_temp(target)
        with open(tmp, "wb") as f:
            f.write(base64.b64decode(blob))
        os.chmod(tmp, request.files[rel].mode)
        os.replace(tmp, target)
    for rel in set(have) - set(request.files):
        try:
            os.remove(os.path.join(cache, rel))
        except OSError:
            pass
    write_json(os.path.join(cache, MANIFEST), {rel: entry.to_wire() for rel, entry in request.files.items()})
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
    shutil.copytree(cache, dest, ignore=shutil.ignore_patterns(MANIFEST))
    return SyncApplyAnswer(len(request.blobs), len(request.files), dest)
