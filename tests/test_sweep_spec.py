"""`sweep:` as tables: the trials a section makes, and each bad section's problem and key."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tfctl.config.loader import parse_config
from tfctl.config.sweep import SweepSpec
from tfctl.errors import ConfigError

BASE = """\
name: s
command: echo {params.lr} {params.batch} {params.seed} {params.opt}
params: {lr: 0.1, batch: 32, seed: 0, opt: adam}
jobs: {worker: [localhost]}
"""


def spec(section: str) -> SweepSpec:
    config = parse_config(BASE + f"sweep: {section}\n", Path("c.yaml"))
    assert config.sweep is not None
    return config.sweep


def problems(section: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        parse_config(BASE + f"sweep: {section}\n", Path("c.yaml"))
    return [(p.key_path, p.message) for p in caught.value.problems]


def test_a_grid_crossed_with_a_zip_makes_every_combination_once_the_last_key_fastest() -> None:
    made = spec("{grid: {lr: [0.1, 0.01, 0.001], batch: [32, 64]}, zip: {seed: [1, 2], opt: [adam, sgd]}}")
    trials = made.trials()
    assert made.count() == len(trials) == 12
    assert trials[:3] == [
        {"lr": 0.1, "batch": 32, "seed": 1, "opt": "adam"},
        {"lr": 0.1, "batch": 32, "seed": 2, "opt": "sgd"},  # zipped: seed 2 goes with sgd, never with adam
        {"lr": 0.1, "batch": 64, "seed": 1, "opt": "adam"},
    ]
    assert {(t["seed"], t["opt"]) for t in trials} == {(1, "adam"), (2, "sgd")}
    assert len({tuple(t.items()) for t in trials}) == 12


def test_random_draws_are_the_same_for_a_seed_within_bounds_and_differ_for_another() -> None:
    draws = "lr: {loguniform: [0.0001, 0.1]}, batch: {uniform: [16, 256]}, opt: {choice: [adam, sgd]}"
    section = "{random: {%s}, samples: 50, seed: %%d}" % draws
    once, again, other = spec(section % 7).trials(), spec(section % 7).trials(), spec(section % 8).trials()
    assert once == again and once != other and len(once) == 50
    lrs, batches = [float(t["lr"]) for t in once], [float(t["batch"]) for t in once]
    assert all(0.0001 <= lr <= 0.1 for lr in lrs) and all(16 <= b <= 256 for b in batches)
    logs = [math.log10(lr) for lr in lrs]  # log-uniform: spread over the decades, not piled at the top
    assert min(logs) < -3 and max(logs) > -2
    assert {t["opt"] for t in once} == {"adam", "sgd"}


def test_random_is_drawn_per_grid_point() -> None:
    made = spec("{grid: {batch: [32, 64]}, random: {lr: {uniform: [0, 1]}}, samples: 3}")
    assert made.count() == 6 and [t["batch"] for t in made.trials()] == [32, 32, 32, 64, 64, 64]


def test_defaults() -> None:
    made = spec("{grid: {lr: [1]}}")
    assert (made.max_parallel, made.retries, made.samples, made.seed) == (1, 0, 1, 0)


@pytest.mark.parametrize(
    "section, key, words",
    [
        ("{}", "sweep", "varies no parameter"),
        ("[lr]", "sweep", "expected a mapping"),
        ("{grid: {lr: []}}", "sweep.grid.lr", "a non-empty list"),
        ("{grid: {lr: 0.1}}", "sweep.grid.lr", "a non-empty list"),
        ("{grid: {lr: [[1]]}}", "sweep.grid.lr[0]", "a number, a string or a boolean"),
        ("{grid: {nope: [1]}}", "sweep.grid.nope", "`nope` is not a parameter of `params:`"),
        ("{zip: {seed: [1, 2], opt: [adam]}}", "sweep.zip", "need one length (seed has 2, opt has 1)"),
        ("{grid: {lr: [1]}, zip: {lr: [2]}}", "sweep.zip.lr", "varied in `grid` already"),
        ("{random: {lr: {normal: [0, 1]}}}", "sweep.random.lr.normal", "unknown distribution"),
        ("{random: {lr: {uniform: [1, 0]}}}", "sweep.random.lr.uniform", "low under high"),
        ("{random: {lr: {loguniform: [0, 1]}}}", "sweep.random.lr.loguniform", "low above 0"),
        ("{random: {lr: [0, 1]}}", "sweep.random.lr", "a mapping of one of"),
        ("{grid: {lr: [1]}, samples: 3}", "sweep.samples", "the sweep has no `random`"),
        ("{grid: {lr: [1]}, max_parallel: 0}", "sweep.max_parallel", "1 or more"),
        ("{grid: {lr: [1]}, retries: -1}", "sweep.retries", "0 or more"),
        ("{grid: {lr: [1]}, parallel: 2}", "sweep.parallel", "unknown key"),
        (
            "{random: {lr: {uniform: [0, 1]}}, samples: 1000000}",
            "sweep",
            "makes 1,000,000 trials, over the 10,000 one sweep runs",
        ),
    ],
)
def test_a_bad_section_names_its_key(section: str, key: str, words: str) -> None:
    found = problems(section)
    assert any(path == key and words in message for path, message in found), found
