"""Tasks of a running run that start anew: moved to a spare (`spares.py`), restarted with them,
or every task in a new allocation (`resubmit.py`). Whoever follows their output hears of it."""

from __future__ import annotations

from typing import Iterable


class Restarting:
    """Told of tasks about to start anew, and once they have (or failed to): an attached `up`
    stops following them before and follows them again after, so no line of their earlier run
    is read twice nor their new output read from the old offset. This one tells nobody."""

    def before(self, names: Iterable[str]) -> None:
        """The tasks `names` are about to start again."""

    def after(self, names: Iterable[str]) -> None:
        """They have started, or failed to."""
