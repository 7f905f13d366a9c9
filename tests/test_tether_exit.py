"""A container task's exit status as its monitor reads it (`Tethered.exit_code`): the tether's
file, even when it is written in the moment between the monitor's read and its look for the
task's processes; the runtime client's status only when the tether wrote none."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfctl.supervisor import containers, procfs


def tethered(tmp_path: Path) -> containers.Tethered:
    """Only what `exit_code` reads: the exit file, the run and task it looks for."""
    boxed = object.__new__(containers.Tethered)
    boxed.exit_file, boxed.run_id, boxed.task = str(tmp_path / containers.EXIT_FILE), "r-1", "ps:0"
    Path(boxed.exit_file).write_text("")  # as `forget_exit` leaves it before each run
    return boxed


# (what the tether's file holds at the first read, what it holds once the task's processes are
# found gone) -> the status recorded (the client's, 0, when the tether wrote none)
CASES = [
    pytest.param("143\n", "143\n", 143, id="written before: the tether's"),
    pytest.param("", "143\n", 143, id="written as the task ended, after the read: still the tether's"),
    pytest.param("", "", 0, id="never written (the tether killed): the client's"),
]


@pytest.mark.parametrize(("first", "then", "recorded"), CASES)
def test_the_tethers_status_wins_over_the_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str, then: str, recorded: int
) -> None:
    boxed = tethered(tmp_path)
    Path(boxed.exit_file).write_text(first)

    def gone(*_: object) -> list[int]:  # the tether writes, then exits, as the monitor looks
        Path(boxed.exit_file).write_text(then)
        return []

    monkeypatch.setattr(procfs, "task_processes", gone)
    assert boxed.exit_code(0, patience=5.0) == recorded
