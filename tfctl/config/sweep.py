"""A cluster file's `sweep:`: the trials it makes, each a set of `params:` values one run takes.

`grid:` lists are crossed, `zip:` lists are taken together (row i of each), and `random:` draws
each trial's values of its parameters from a distribution, `samples:` draws per grid and zip
point. Trials are made once, when the sweep is created, and kept with it: a resumed sweep runs
the same ones whatever became of the file or the random generator.
"""

from __future__ import annotations

import enum
import itertools
import math
import random
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Union

Scalar = Union[str, int, float, bool]
MAX_TRIALS = 10_000  # in one sweep: more is a mistake (a grid of typos), not a plan


class Draw(str, enum.Enum):
    """How `random:` draws one parameter."""

    UNIFORM = "uniform"  # a float in [low, high)
    LOGUNIFORM = "loguniform"  # a float whose logarithm is uniform in [log low, log high)
    CHOICE = "choice"  # one of the values, each as likely

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Distribution:
    """One parameter's distribution under `random:`: `{uniform: [low, high]}`, `{loguniform:
    [low, high]}` or `{choice: [a, b, ...]}`."""

    draw: Draw
    values: tuple[Scalar, ...]  # (low, high), or the choices

    def sample(self, rng: random.Random) -> Scalar:
        if self.draw is Draw.CHOICE:
            return self.values[rng.randrange(len(self.values))]
        low, high = float(self.values[0]), float(self.values[1])
        if self.draw is Draw.UNIFORM:
            return _shown(rng.uniform(low, high))
        return _shown(math.exp(rng.uniform(math.log(low), math.log(high))))


@dataclass(frozen=True)
class TrialOf:
    """Which trial of which sweep a run is: a run of its own, one of the sweep's."""

    sweep: str  # the sweep's id
    index: int  # the trial's place in `SweepSpec.trials()`


def _frozen() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class SweepSpec:
    """The validated `sweep:` section."""

    grid: Mapping[str, tuple[Scalar, ...]] = field(default_factory=_frozen)
    zip: Mapping[str, tuple[Scalar, ...]] = field(default_factory=_frozen)
    random: Mapping[str, Distribution] = field(default_factory=_frozen)
    samples: int = 1  # draws of `random:` per grid and zip point
    seed: int = 0  # of the draws: the same file makes the same trials
    max_parallel: int = 1  # trials running at once
    retries: int = 0  # a failed trial is started again this many times before it counts as failed

    def names(self) -> list[str]:
        """The parameters the sweep varies, in the order a trial lists them."""
        return [*self.grid, *self.zip, *self.random]

    def count(self) -> int:
        """How many trials it makes (without making them: a mistake may make 10^9)."""
        rows = len(next(iter(self.zip.values()))) if self.zip else 1
        return math.prod(len(v) for v in self.grid.values()) * rows * (self.samples if self.random else 1)

    def trials(self) -> list[dict[str, Scalar]]:
        """Every trial's parameters: the grid crossed (the last key varying fastest), each point
        with every zip row, each of those with `samples` draws of the random ones."""
        rng = random.Random(self.seed)
        points = [dict(zip(self.grid, values)) for values in itertools.product(*self.grid.values())]
        rows = [dict(zip(self.zip, values)) for values in zip(*self.zip.values())] if self.zip else [{}]
        draws = self.samples if self.random else 1
        return [
            {**point, **row, **{name: d.sample(rng) for name, d in self.random.items()}}
            for point in points
            for row in rows
            for _ in range(draws)
        ]


def _shown(value: float) -> float:
    """A drawn float to 6 significant digits: what a table and a flag show, and what runs."""
    return float(f"{value:.6g}")
