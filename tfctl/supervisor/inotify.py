"""Sleep until a task's files change (Linux inotify through ctypes), instead of polling them.

A follow stream spends most of a run waiting; polling each task's files ten times a second costs
a host CPU all along. `Changes` wakes only when a watched directory changed and says which ones
and what changed in them. `Changes.open()` is None where inotify cannot be had (not Linux, no
ctypes, out of watches): the caller then polls, as before.
"""

from __future__ import annotations

import errno
import os
import select
import struct
from typing import TYPE_CHECKING, Dict, Optional, Set

if TYPE_CHECKING:
    import ctypes

IN_MODIFY = 0x002
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_Q_OVERFLOW = 0x4000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = 0o2000000
EVENT = struct.Struct("iIII")  # wd, mask, cookie, length of the name that follows
ALL = "*"  # in `wait`'s answer: events were lost, anything may have changed


class Changes:
    """inotify watches on directories, each named by a key (a task)."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self._fd = fd
        self._keys: Dict[int, str] = {}

    @classmethod
    def open(cls) -> Optional[Changes]:
        # ctypes is loaded here, by the follow streams that sleep on it, not by every supervisor
        # start; the process's own symbols hold libc's, without searching for it (ctypes.util
        # would import tempfile and random for that).
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (ImportError, OSError, AttributeError):
            return None
        return cls(libc, fd) if fd >= 0 else None

    def watch(self, key: str, directory: str) -> bool:
        """Watch files written, created or renamed into `directory`; False if it cannot be."""
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), IN_MODIFY | IN_MOVED_TO | IN_CREATE)
        if wd < 0:
            return False
        self._keys[wd] = key
        return True

    def wait(self, timeout: float) -> Dict[str, Set[str]]:
        """The names of the files that changed, by key, once something did or `timeout` passed."""
        readable, _, _ = select.select([self._fd], [], [], max(0.0, timeout))
        changed: Dict[str, Set[str]] = {}
        while readable:
            try:
                buf = os.read(self._fd, 65536)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                raise
            pos = 0
            while pos + EVENT.size <= len(buf):
                wd, mask, _, length = EVENT.unpack_from(buf, pos)
                name = buf[pos + EVENT.size : pos + EVENT.size + length].rstrip(b"\0")
                pos += EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    changed.setdefault(ALL, set())
                elif wd in self._keys:
                    changed.setdefault(self._keys[wd], set()).add(os.fsdecode(name))
        return changed

    def close(self) -> None:
        os.close(self._fd)
