"""The one exception tree of tfctl.

Library code raises these and never exits; `cli.main` is the only place that maps them to
exit codes, so a user mistake prints a sentence and a fix, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class TfctlError(Exception):
    """Base of every error tfctl reports to the user; `hint` says what to do about it."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(TfctlError):
    """The user asked for something that cannot be done as asked (bad flag, unknown run)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong in a cluster file, located precisely enough to fix without searching."""

    file: Path
    line: int | None
    column: int | None
    key_path: str
    message: str
    fix: str | None = None

    def __str__(self) -> str:
        where = str(self.file)
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        text = f"{where}: {self.key_path}: {self.message}" if self.key_path else f"{where}: {self.message}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class ConfigError(UsageError):
    """A cluster file that does not validate; carries every problem found, not just the first."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        head = (
            f"{count} problem{'s' if count != 1 else ''} in {self.problems[0].file}"
            if count
            else "invalid cluster file"
        )
        super().__init__(head + "\n" + "\n".join(str(p) for p in self.problems))


class HostError(TfctlError):
    """A host could not be reached or the supervisor on it failed."""

    def __init__(self, host: str, message: str, hint: str | None = None) -> None:
        super().__init__(f"{host}: {message}", hint)
        self.host = host


class StartupError(TfctlError):
    """The cluster could not be brought up; whatever had started has already been stopped."""


class BackendError(TfctlError):
    """The backend refused, lost or ended what it held for the run (a scheduler's allocation)."""


class TrackingError(TfctlError):
    """The experiment tracker did not answer or refused: said once, never the run's failure."""
