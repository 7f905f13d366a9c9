"""A host the run left (its tasks moved to a spare), until it is struck off the record.

A host that was only frozen comes back with its tasks, which must not train beside their moved
selves: the controller asks it to stop what the run ran there every `RETIRE_POLL` seconds until
it answers with nothing left, then strikes it off the record's lost hosts. Processes that
survive SIGKILL (uninterruptible sleep on a hung filesystem) keep it on the record, said once.
Decided here from each answer, carried out by `controller/live/spares.py`; tested as a table
in `tests/test_engine_retiring.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

RETIRE_POLL = 5.0  # seconds between two requests that a host the run left stop what it ran


@dataclass(frozen=True)
class LeftBehind:
    """A returning host's answer to the stop: what it stopped, and what survived it."""

    processes: int
    remaining: tuple[int, ...] = ()


@dataclass(frozen=True)
class Retiring:
    """One left host's retirement so far."""

    host: str
    said_survivors: bool = False


@dataclass(frozen=True)
class RetireStep:
    """What to do after one stop request: what to say, whether to strike the host off the
    record, and when to ask again (None: done)."""

    state: Retiring
    ask_again_in: float | None
    say: str | None = None
    strike_off: bool = False


def after_stop_asked(state: Retiring, answer: LeftBehind | None) -> RetireStep:
    """The next step once the host answered the stop (`answer`), or stayed silent (None)."""
    if answer is None:
        return RetireStep(state, RETIRE_POLL)
    if answer.remaining:
        if state.said_survivors:
            return RetireStep(state, RETIRE_POLL)
        pids = ", ".join(map(str, answer.remaining))
        said = f"{state.host} answers again, but processes of the run survive SIGKILL there: {pids}"
        return RetireStep(replace(state, said_survivors=True), RETIRE_POLL, say=said)
    said = f"{state.host} answers again: stopped the {answer.processes} process(es) of the run it still had"
    return RetireStep(state, None, say=said, strike_off=True)
