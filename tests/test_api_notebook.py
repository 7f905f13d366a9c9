"""The notebook session of the docs' Python page (examples/notebook.py), run as a user runs it:
the embedded default started from Python, followed to its first step, read, waited on, and its
final accuracy read back; nothing of it left running."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, marked_processes

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed (pip install -e '.[tf]')"
    ),
]


def test_the_notebook_session_trains_the_embedded_default(home: Path) -> None:
    ran = subprocess.run(
        [sys.executable, str(REPO / "examples" / "notebook.py")],
        cwd=REPO,
        env={**os.environ, "TFCTL_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    out = ran.stdout
    run_id = re.search(r"^run (\S+) started$", out, re.M).group(1)  # type: ignore[union-attr]
    assert re.search(r"^first step: step \d+ worker 0 loss", out, re.M), out
    assert re.search(r"^  ps:0 +running +on localhost", out, re.M), out
    assert f"run {run_id} succeeded: worker:0 finished successfully" in out
    accuracy = float(re.search(r"^final test accuracy (\S+)$", out, re.M).group(1))  # type: ignore[union-attr]
    assert accuracy > 0.8
    assert ran.stderr == ""  # nothing printed but what the script asked for
    assert [pid for pid, (_, run) in marked_processes().items() if run == run_id] == []
