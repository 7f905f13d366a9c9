"""Claims on a host's GPUs, cores and task slots, shared by every user's tfctl on the host.

A claim is an exclusive `flock` on one file per resource (`gpu-2`, `cpu-5`, `task-0`) in a
host-local folder every user reaches (`/var/tmp/tfctl-claims`, mode 1777 like /tmp): the kernel
decides who holds it, at once and for every user, so two runs never hold one GPU even when they
claim in the same instant. The task's monitor takes its claims and hands them to its task, so a
claim lasts exactly as long as a process of the task is alive to use what it names: a monitor
that dies leaves them with its task; the last of the two to end frees them (a lease that runs
out stops both). Nothing depends on locks over NFS: the folder is the host's own.

The sticky bit lets each user create and remove only their own files, so one user sees the
other's claims (`/proc/locks`, and the note each holder writes beside them) but cannot take or
free them. Stdlib only, as the whole supervisor.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import stat
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from . import devices
from .errors import AgentError
from .protocol import HoldingsAnswer, HoldingsRequest
from .queue_records import QueueNote
from .task_records import ClaimAsk, Holding

CLAIMS_ENV = "TFCTL_CLAIMS_DIR"  # another folder for the claims (a test's, or an admin's choice)
DEFAULT_DIR = "/var/tmp/tfctl-claims"
SHARED_MODE = 0o1777
# A queue note its user's queue has not written again for this long is its queue gone: a driver
# rewrites its note every few seconds while it has runs waiting.
QUEUE_NOTE_TTL = 60.0


class ClaimTaken(AgentError):
    """A resource the task asks for is held by another run: placed again, or waited for."""


class Claims:
    """What one task holds: the open files whose locks are its claims, and its note."""

    def __init__(self, folder: str, fds: List[int], resources: List[str], note: Optional[str]) -> None:
        self.folder = folder
        self.fds = fds
        self.resources = resources
        self.note = note

    def cores(self, offered: Sequence[int]) -> List[int]:
        """The host's cores the claimed `cpu-N` name (the N-th of those the task may run on)."""
        picked = [int(r.split("-")[1]) for r in self.resources if r.startswith("cpu-")]
        if any(n >= len(offered) for n in picked):
            raise ValueError("the pool counts more cores on this host than the %d tasks may run on" % len(offered))
        return [offered[n] for n in picked]

    def release(self) -> None:
        """Drop this process's hold (a task still running keeps its own) and remove the note."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        if self.note is not None:
            _discard(self.note)


def folder() -> str:
    """The claims folder, made if missing; AgentError with the fix if it is not safe to share."""
    path = os.environ.get(CLAIMS_ENV) or DEFAULT_DIR
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, SHARED_MODE)  # after mkdir: the umask would take bits off
    except FileExistsError:
        pass
    except OSError as e:
        raise AgentError("cannot make the claims folder %s: %s" % (path, e.strerror)) from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or stat.S_IMODE(info.st_mode) != SHARED_MODE:
        raise AgentError(
            "the claims folder %s is not a folder of mode 1777 (sticky, every user's); "
            "fix: `sudo install -d -m 1777 %s`" % (path, path)
        )
    return path


def take(ask: ClaimAsk, run_id: str, task: str) -> Claims:
    """Every resource `ask` names, or none: ClaimTaken naming who holds the first one missing."""
    where = folder()
    fds: List[int] = []
    names: List[str] = []
    try:
        for gpu in sorted(ask.gpus):
            if not _lock(where, "gpu-%d" % gpu, fds):
                raise ClaimTaken("GPU %d is %s" % (gpu, _whose(where, "gpu-%d" % gpu)))
            names.append("gpu-%d" % gpu)
        for kind, wanted, limit in (
            ("cpu", ask.cpus, ask.cpu_limit),
            ("task", 1 if ask.task_limit else 0, ask.task_limit),
        ):
            got: List[str] = []
            for i in range(limit):
                if len(got) == wanted:
                    break
                if _lock(where, "%s-%d" % (kind, i), fds):
                    got.append("%s-%d" % (kind, i))
            if len(got) < wanted:
                what = "cores" if kind == "cpu" else "task slots"
                raise ClaimTaken("%d of its %d %s are held by other runs" % (limit - len(got), limit, what))
            names.extend(got)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    note = _write_note(where, run_id, task, names) if names else None
    return Claims(where, fds, names, note)


def holdings() -> List[Holding]:
    """Every resource held on this host now, as the kernel's lock table says, with its holder's note."""
    where = folder()
    locked = _locked_inodes()
    notes = _notes(where)
    held = []
    for name in sorted(os.listdir(where)):
        if name.startswith(("note.", "queue.", ".")):
            continue
        try:
            info = os.lstat(os.path.join(where, name))
        except FileNotFoundError:
            continue
        pid = locked.get((os.major(info.st_dev), os.minor(info.st_dev), info.st_ino))
        if pid is None:
            continue
        note = notes.get(name, {})
        held.append(
            Holding(name, str(note.get("user", "")), str(note.get("run_id", "")), str(note.get("task", "")), pid)
        )
    return held


def _lock(where: str, name: str, fds: List[int]) -> bool:
    """Open (creating it if it is not there yet) and lock one resource's file; False: held."""
    path = os.path.join(where, name)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        try:  # O_CREAT only for a new file: fs.protected_regular refuses it on another user's
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o444)
        except FileExistsError:
            fd = os.open(path, flags)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    fds.append(fd)
    return True


def _whose(where: str, name: str) -> str:
    note = _notes(where).get(name)
    if not note:
        return "held by another process"
    return "held by run %s (task %s) of user %s" % (note.get("run_id"), note.get("task"), note.get("user"))


def _write_note(where: str, run_id: str, task: str, names: List[str]) -> str:
    """`note.<uid>.<pid>`: whose the claims are, for `tfctl pool`; this user's own stale notes
    (their holder gone) are removed on the way."""
    uid = os.getuid()
    for stale in os.listdir(where):
        parts = stale.split(".")
        if len(parts) == 3 and parts[0] == "note" and parts[1] == str(uid) and not _alive(int(parts[2] or 0)):
            _discard(os.path.join(where, stale))
    path = os.path.join(where, "note.%d.%d" % (uid, os.getpid()))
    body = {"user": _user(uid), "uid": uid, "run_id": run_id, "task": task, "resources": names, "pid": os.getpid()}
    temp = path + ".tmp"
    with open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644), "w") as out:
        json.dump(body, out)
    os.rename(temp, path)
    return path


def _notes(where: str) -> Dict[str, Dict[str, object]]:
    """resource -> the note of the newest holder that names it."""
    named: Dict[str, Dict[str, object]] = {}
    for name in sorted(os.listdir(where)):
        if not name.startswith("note.") or name.endswith(".tmp"):
            continue
        try:
            with open(os.path.join(where, name)) as f:
                note = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(note, dict):
            for resource in note.get("resources") or []:
                named[str(resource)] = note
    return named


def _locked_inodes() -> Dict[Tuple[int, int, int], int]:
    """(major, minor, inode) -> pid of every FLOCK the kernel holds (`/proc/locks`)."""
    found: Dict[Tuple[int, int, int], int] = {}
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        words = line.split()
        if "->" in words or len(words) < 6 or words[1] != "FLOCK":
            continue
        try:
            major, minor, inode = words[5].split(":")
            found[(int(major, 16), int(minor, 16), int(inode))] = int(words[4])
        except ValueError:
            continue
    return found


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _discard(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_queue_note(note: QueueNote) -> None:
    """`queue.<uid>.<store>`: this user's queue (of one run store) as other users' queues see
    it, written whole under a name of its own and renamed into place (a reader never sees half of
    it); an empty queue removes it. Readable by every user whatever the umask."""
    where = folder()
    store = "".join(c for c in note.store if c.isalnum())[:32] or "-"
    path = os.path.join(where, "queue.%d.%s" % (os.getuid(), store))
    if not note.waiting and not note.intents:
        _discard(path)
        return
    try:
        with open(path) as f:
            before = {i.run_id: i.written for i in QueueNote.from_wire(json.load(f)).intents}
    except (OSError, ValueError, TypeError, KeyError):
        before = {}
    now = time.time()  # an intent's time is when it was first written here, by this host's clock
    note = note.replace(intents=[i.replace(written=before.get(i.run_id, now)) for i in note.intents])
    fd, temp = tempfile.mkstemp(dir=where, prefix=".queue.")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as out:
            json.dump(note.to_wire(), out)
        os.rename(temp, path)
    except BaseException:
        _discard(temp)
        raise


def queue_notes(now: float) -> List[QueueNote]:
    """Every queue note here written within `QUEUE_NOTE_TTL`, each with its age and its user
    as the file's owner (a note cannot speak for another user)."""
    where = folder()
    found = []
    for name in sorted(os.listdir(where)):
        if not name.startswith("queue."):
            continue
        path = os.path.join(where, name)
        try:
            info = os.stat(path)
            with open(path) as f:
                note = QueueNote.from_wire(json.load(f))
        except (OSError, ValueError, TypeError, KeyError):
            continue  # gone meanwhile, or not a note: nobody's queue to consider
        age = now - info.st_mtime
        if age <= QUEUE_NOTE_TTL:
            found.append(note.replace(user=_user(info.st_uid), age=max(age, 0.0)))
    return found


def answer(_root: str, request: HoldingsRequest) -> HoldingsAnswer:
    """The `holdings` verb: this user's queue note written (when given), then every claim here,
    the GPUs' processes and every user's queue note."""
    if request.note is not None:
        try:
            write_queue_note(request.note)
        except OSError:
            pass  # (a full disk): the holdings are still the answer; the note is written next time
    busy, error = devices.gpu_processes()
    notes = queue_notes(time.time())
    held = holdings()
    return HoldingsAnswer(held, {str(k): v for k, v in sorted(busy.items())}, error or "", notes, _user(os.getuid()))
