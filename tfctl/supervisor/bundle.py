"""The supervisor as one file for the hosts: a zipapp of this package, named by its content hash.

Controller-only (never zipped itself). The zip is built in memory with sorted names and fixed
timestamps, so the same code always gives the same bytes and the same name: a host that already
has the file is known to run exactly this code, and a changed tfctl ships a new file.
"""

from __future__ import annotations

import functools
import hashlib
import io
import zipfile
from pathlib import Path
from typing import Mapping

PACKAGE = "tfctl_supervisor"  # the package's name inside the zipapp
CONTROLLER_ONLY = frozenset({"bundle.py"})
# The zipapp's own entry point. Python cannot cache compiled modules inside a zip, so the first
# run unpacks the zip beside itself (`supervisor-<hash>.d`, through a temporary name unique to
# this host and process, so hosts sharing a home never see half a copy) and every run, and every
# task monitor, then imports from there: a supervisor starts in about half the time.
ROOT_MAIN = b"""\
import os
import sys

here = sys.path[0]
if os.path.isfile(here):
    unpacked = os.path.splitext(here)[0] + ".d"
    if not os.path.isdir(unpacked):
        import shutil
        import zipfile

        scratch = "%s.%s.%d.tmp" % (unpacked, os.uname()[1], os.getpid())
        try:
            with zipfile.ZipFile(here) as archive:
                archive.extractall(scratch)
            os.rename(scratch, unpacked)
        except OSError:
            pass  # unpacked meanwhile by another process, or no room: run from the zip
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if os.path.isfile(os.path.join(unpacked, "__main__.py")):
        sys.path[0] = unpacked

import runpy

runpy.run_module("@PACKAGE@", run_name="__main__")
""".replace(b"@PACKAGE@", PACKAGE.encode())
EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip can record


def runtime_files() -> dict[str, bytes]:
    """Name in the zip -> content: the package's runtime modules and the zip's own entry point."""
    here = Path(__file__).parent
    files = {
        f"{PACKAGE}/{path.name}": path.read_bytes() for path in here.glob("*.py") if path.name not in CONTROLLER_ONLY
    }
    files["__main__.py"] = ROOT_MAIN
    return files


def zipapp(files: Mapping[str, bytes]) -> bytes:
    """A deterministic zip: the same files give the same bytes, whenever and wherever built."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:  # stored: no zlib needed to run it
        for name in sorted(files):
            entry = zipfile.ZipInfo(name, EPOCH)
            entry.create_system = 3  # unix, whatever the controller runs on
            entry.external_attr = 0o644 << 16
            zf.writestr(entry, files[name])
    return buffer.getvalue()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def artifact() -> tuple[str, bytes]:
    """(content hash, zipapp bytes) of the supervisor, built once per process."""
    data = zipapp(runtime_files())
    return digest(data), data
