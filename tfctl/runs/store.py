"""The run store: what each `up` started, where, and how it ended.

Layout: $TFCTL_HOME (default ~/.tfctl, mode 0700)/runs/<run_id>/run.json. Writes are atomic
(temp file + rename) and every read-modify-write holds one store-wide lock, so two tfctl calls
never corrupt a record. Hosts keep task logs and exit codes themselves; this is the index.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Iterator

from tfctl.config.home import tfctl_home
from tfctl.errors import TfctlError, UsageError
from tfctl.runs.record import SCHEMA_VERSION, NewerRecordError, RunRecord
from tfctl.supervisor.states import RunState

CLUSTER_FILE = "cluster.yaml"  # the cluster file as the run started from it (`transitions.keep_cluster_file`)


def new_run_id(cluster_name: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{cluster_name}-{stamp}-{secrets.token_hex(2)}"


class RunStore:
    """Run records under one home directory. Constructing it touches nothing on disk."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or tfctl_home()
        self.runs_dir = self.home / "runs"

    @property
    def store_id(self) -> str:
        """Names this store on every host (TFCTL_STORE), so `down --all` reaps only its own orphans."""
        key = f"{socket.gethostname()}:{self.home.resolve()}"
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    def _ensure(self) -> None:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive store-wide lock for read-modify-write sequences."""
        self._ensure()
        with open(self.home / "lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def create(self, record: RunRecord) -> None:
        """Store a new run; two runs can never share an id (and so a record). Like `save` and
        `forget`, for `runs.transitions` alone (and tests seeding records): nothing else writes."""
        self._ensure()
        try:
            (self.runs_dir / record.run_id).mkdir(mode=0o700)
        except FileExistsError:
            raise UsageError(f"run id {record.run_id} is already taken", hint="run the command again") from None
        self.save(record)

    def save(self, record: RunRecord) -> None:
        self._ensure()
        run_dir = self.runs_dir / record.run_id
        run_dir.mkdir(mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".run.json.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record.to_json(), f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, run_dir / "run.json")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def load(self, run_id: str) -> RunRecord:
        path = self.runs_dir / run_id / "run.json"
        try:
            return _read(path)
        except FileNotFoundError:
            raise UsageError(
                f"no run {run_id!r} in {self.runs_dir}", hint="`tfctl runs` lists the runs tfctl knows"
            ) from None
        except (ValueError, TypeError, KeyError) as e:
            raise TfctlError(
                f"the record of run {run_id} is damaged ({path}: {e})",
                hint="its task logs are still on the hosts; remove the run directory to forget it",
            ) from None

    def all(self) -> list[RunRecord]:
        """Every run, oldest first."""
        if not self.runs_dir.is_dir():
            return []
        records = []
        for path in self.runs_dir.glob("*/run.json"):
            try:
                records.append(_read(path))
            except (ValueError, TypeError, KeyError):
                continue  # damaged: `load` says so when asked for it (a newer one is refused: `_read`)
        return sorted(records, key=lambda r: r.created_at)

    def latest(
        self,
        cluster_file: Path,
        trial_of: tuple[str | None, int | None] | None = (None, None),
        queued_too: bool = True,
    ) -> RunRecord | None:
        """The newest run started from this cluster file: by `up` (the default), as that trial
        of that sweep (`RunRecord.trial_of`), or either (None); with `queued_too` False, not one
        that was submitted to a queue (those do not count for the one-live-run rule)."""
        wanted = str(cluster_file.resolve())
        matches = [
            r
            for r in self.all()
            if r.cluster_file == wanted
            and (trial_of is None or r.trial_of == trial_of)
            and (queued_too or r.priority is None)
        ]
        return matches[-1] if matches else None

    def forget(self, run_id: str) -> None:
        """Remove a run's record and its directory here (nothing of it on any host to keep)."""
        with self.lock():
            shutil.rmtree(self.runs_dir / run_id, ignore_errors=True)

    @property
    def queue_dir(self) -> Path:
        """The queue's own files: a mark per queued run, its driver's lock and its last look."""
        return self.home / "queue"

    def mark_queued(self, run_id: str, queued: bool) -> None:
        """Mark (or unmark) a run as waiting in the queue: a file per run, so whether anything
        waits is one listing, not a read of every record (every tfctl command asks it)."""
        marks = self.queue_dir / "runs"
        if queued:
            marks.mkdir(parents=True, exist_ok=True)
            (marks / run_id).touch()
        else:
            with contextlib.suppress(FileNotFoundError):
                (marks / run_id).unlink()

    def queued_ids(self) -> list[str]:
        """The runs marked as queued, in no order (a mark may outlive its record for a moment)."""
        try:
            return os.listdir(self.queue_dir / "runs")
        except FileNotFoundError:
            return []

    def exists(self, run_id: str) -> bool:
        return (self.runs_dir / run_id / "run.json").is_file()

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def kept_cluster_file(self, run_id: str) -> str | None:
        """The text `transitions.keep_cluster_file` kept; None for a run recorded by a tfctl that kept none."""
        try:
            return (self.run_dir(run_id) / CLUSTER_FILE).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None


def _read(path: Path) -> RunRecord:
    """The record in `path`. A record written by a newer tfctl is refused, not skipped as damaged:
    its run may be live, and a `down --all` that took its tasks for orphans would stop them."""
    try:
        return RunRecord.from_json(json.loads(path.read_text()))
    except NewerRecordError as e:
        raise TfctlError(
            f"{path} was written by a newer tfctl (run record version {e.version}; "
            f"this tfctl reads versions up to {SCHEMA_VERSION})",
            hint="upgrade tfctl to use this run store",
        ) from None


def resolve_run(store: RunStore, cluster_file: Path, run_id: str | None, queued: bool = True) -> RunRecord:
    """The run named by --run, else the cluster file's newest live run (queued, starting or
    running), else its newest run; with `queued` False, never a queued one (no task to read)."""
    if run_id:
        return store.load(run_id)
    wanted = str(cluster_file.resolve())
    runs = [r for r in store.all() if r.cluster_file == wanted and (queued or r.state is not RunState.QUEUED)]
    live = [r for r in runs if r.active]
    record = live[-1] if live else (runs[-1] if runs else None)
    if record is None:
        raise UsageError(f"no run of {cluster_file} yet", hint=f"start one with `tfctl -f {cluster_file} up`")
    return record
