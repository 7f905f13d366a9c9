"""`resume`: a new run continues an earlier one by finding its files in its own $TFCTL_RUN_DIR.

Every file of the earlier run's directory that the new one lacks (checkpoints, summaries; not
the synced code, which the new run brought) is brought in. Big files are hard-linked: instant
whatever their size, and safe because TensorFlow writes each checkpoint's data to a new name and
never into an old one. Small files (a checkpoint's index, which programs may rewrite in place)
are copied, so a rewrite changes the new run's copy only and the earlier run stays as it ended.
Where a link is impossible (another filesystem) the file is copied. A marker makes a replay, or
a second host on a shared home, a no-op that reports what the first did.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from typing import Tuple

from .files import read_json, work_dir, write_json
from .protocol import ResumeAnswer, ResumeRequest

MARKER = ".tfctl-resumed.json"
LINK_FROM = 1 << 20  # bytes: smaller files are copied


def resume(root: str, request: ResumeRequest) -> ResumeAnswer:
    source = work_dir(root, request.resume_from)
    dest = work_dir(root, request.run_id)
    if not os.path.isdir(source):
        return ResumeAnswer(found=False, dest=dest)
    os.makedirs(dest, mode=0o700, exist_ok=True)
    with open(os.path.join(dest, MARKER + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # hosts sharing this home resume it once, one at a time
        done = read_json(os.path.join(dest, MARKER))
        if done and done.get("from") == request.resume_from:
            return ResumeAnswer(found=True, dest=dest, linked=done["linked"], copied=done["copied"])
        linked, copied = adopt(source, dest)
        write_json(os.path.join(dest, MARKER), {"from": request.resume_from, "linked": linked, "copied": copied})
    return ResumeAnswer(found=True, dest=dest, linked=linked, copied=copied)


def adopt(source: str, dest: str) -> Tuple[int, int]:
    """Link (else copy) into `dest` every file under `source` that `dest` lacks; (linked, copied)."""
    linked = copied = 0
    for top, dirs, files in os.walk(source):
        rel = os.path.relpath(top, source)
        target_dir = dest if rel == "." else os.path.join(dest, rel)
        os.makedirs(target_dir, mode=0o700, exist_ok=True)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
        for name in files:
            if rel == "." and name.startswith(MARKER):
                continue  # the earlier run's own resume bookkeeping
            src, dst = os.path.join(top, name), os.path.join(target_dir, name)
            if os.path.lexists(dst):
                continue  # the new run's own (its synced code) wins
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                copied += 1
                continue
            if os.path.getsize(src) >= LINK_FROM and _linked(src, dst):
                linked += 1
            else:
                shutil.copy2(src, dst)
                copied += 1
    return linked, copied


def _linked(src: str, dst: str) -> bool:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        return False
    return True
