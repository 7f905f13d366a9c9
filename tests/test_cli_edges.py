"""The command line at its edges: interrupted while it loads, or given a home it cannot use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfctl.runs.store import RunStore

ROOT = Path(__file__).resolve().parents[1]

INTERRUPT_WHILE_LOADING = """
import sys

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "tfctl.cli":
            raise KeyboardInterrupt  # as Ctrl-C would, in the middle of the imports
        return None

sys.meta_path.insert(0, Interrupt())
sys.argv = ["tfctl", "--help"]
import tfctl
tfctl.main()
"""


def test_ctrl_c_while_the_command_line_loads_exits_130_without_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPT_WHILE_LOADING], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert (done.returncode, done.stderr) == (130, "")


def run_main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    from tfctl.cli import main

    monkeypatch.setattr(sys, "argv", ["tfctl", *args])
    with pytest.raises(SystemExit) as ended:
        main()
    code = ended.value.code
    assert isinstance(code, int)
    return code


def test_a_home_tfctl_cannot_read_is_a_usage_error_naming_it_and_the_fix(tmp_path, monkeypatch, capsys) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TFCTL_HOME", str(home))

    def denied(_store: RunStore) -> list:
        raise PermissionError(13, "Permission denied", str(home / "runs"))

    monkeypatch.setattr(RunStore, "all", denied)
    assert run_main(monkeypatch, "runs") == 2
    err = capsys.readouterr().err
    assert f"error: cannot use tfctl's directory {home}: Permission denied ({home}/runs)" in err
    assert "set TFCTL_HOME to a directory you own" in err and "Traceback" not in err


def test_a_permission_error_elsewhere_is_not_blamed_on_the_home(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TFCTL_HOME", str(tmp_path / "home"))

    def denied(_store: RunStore) -> list:
        raise PermissionError(13, "Permission denied", "/etc/somewhere")

    monkeypatch.setattr(RunStore, "all", denied)
    with pytest.raises(PermissionError):
        run_main(monkeypatch, "runs")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory: needs an ordinary user")
def test_an_unreadable_home_for_real(tmp_path) -> None:
    home = tmp_path / "locked"
    home.mkdir(mode=0o000)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tfctl", "runs"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            env={**os.environ, "TFCTL_HOME": str(home)},
        )
    finally:
        home.chmod(0o700)
    assert done.returncode == 2 and "cannot use tfctl's directory" in done.stderr and "Traceback" not in done.stderr
