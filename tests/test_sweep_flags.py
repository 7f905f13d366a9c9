"""`tfctl sweep --grid/--zip/--random`: the trials of a sweep given as flags are the ones the same
`sweep:` in the file makes, checked by the same rules, each problem named by its flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import tfctl
from tfctl.config.base import Doc
from tfctl.config.sweep_flags import flagged_spec, section
from tfctl.config.sweep_keys import _sweep
from tfctl.errors import ConfigError, UsageError

PARAMS = {"lr": 0.1, "batch": 32, "seed": 0, "opt": "adam"}

SAME = [
    (
        {"grid": ["lr=0.1,0.01", "batch=32,64"], "zipped": ["seed=1,2"]},
        {"grid": {"lr": [0.1, 0.01], "batch": [32, 64]}, "zip": {"seed": [1, 2]}},
    ),
    (
        {"drawn": ["lr=loguniform:0.0001:0.1", "opt=choice:adam,sgd"], "samples": 5, "seed": 3},
        {"random": {"lr": {"loguniform": [0.0001, 0.1]}, "opt": {"choice": ["adam", "sgd"]}}, "samples": 5, "seed": 3},
    ),
    ({"grid": ["opt=adam,true,0.001"]}, {"grid": {"opt": ["adam", True, 0.001]}}),
]


@pytest.mark.parametrize("flags, written", SAME, ids=["grid and zip", "random", "values as YAML reads them"])
def test_flags_make_the_trials_the_same_section_in_the_file_makes(flags: dict, written: dict) -> None:
    given = section(
        flags.get("grid", ()), flags.get("zipped", ()), flags.get("drawn", ()), flags.get("samples"), flags.get("seed")
    )
    assert given == written
    from_file = _sweep(Doc(Path("c.yaml")), "sweep", written)
    assert flagged_spec(Path("c.yaml"), given, None, PARAMS).trials() == from_file.trials()


REFUSED = [
    (["grid"], ["lr"], UsageError, "--grid lr: expected NAME=VALUES"),
    (["drawn"], ["lr=normal:0:1"], UsageError, "--random: unknown distribution `normal`"),
    (["grid"], ["momentum=0.9,0.99"], ConfigError, "--grid momentum: `momentum` is not a parameter of `params:`"),
    (["zipped"], ["lr=1,2", "seed=1"], ConfigError, "--zip: its lists are taken together"),
    (["drawn"], ["lr=uniform:1:0"], ConfigError, "--random lr: needs [low, high]"),
    (
        ["grid"],
        ["lr=" + ",".join(map(str, range(200))), "batch=" + ",".join(map(str, range(60)))],
        ConfigError,
        "12,000 trials",
    ),
]


@pytest.mark.parametrize("flag, values, error, said", REFUSED, ids=[r[3][:40] for r in REFUSED])
def test_a_bad_flag_is_refused_naming_it(flag: list[str], values: list[str], error: type, said: str) -> None:
    args: dict[str, tuple[str, ...]] = {"grid": (), "zipped": (), "drawn": ()}
    args[flag[0]] = tuple(values)
    with pytest.raises(error) as raised:
        flagged_spec(Path("c.yaml"), section(args["grid"], args["zipped"], args["drawn"], None, None), None, PARAMS)
    assert said in str(raised.value) or any(
        said in f"{p.key_path}: {p.message}" for p in getattr(raised.value, "problems", ())
    ), raised.value


def test_the_files_parallelism_stays_and_the_flags_replace_what_it_varies(tmp_path: Path, home: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("""name: fl
command: "{python} -c 'print(\\"final test accuracy {params.acc} after 10 global steps\\")'"
params: {acc: 0.5, seed: 0}
jobs:
  worker: [localhost]
sweep: {grid: {acc: [0.1, 0.2, 0.3]}, max_parallel: 2}
""")
    swept = tfctl("-f", str(cluster), "sweep", "--grid", "acc=0.9,0.8", "--zip", "seed=1,2", home=home, timeout=120)
    assert swept.returncode == 0, swept.stderr
    assert "4 trials, 2 at a time" in swept.stderr
    shown = json.loads(tfctl("-f", str(cluster), "sweep", "status", "--json", home=home).stdout)
    assert [t["params"] for t in shown["trials"]] == [
        {"acc": 0.9, "seed": 1},
        {"acc": 0.9, "seed": 2},
        {"acc": 0.8, "seed": 1},
        {"acc": 0.8, "seed": 2},
    ]
    again = tfctl("-f", str(cluster), "sweep", "--resume", "--grid", "acc=1", home=home)
    assert again.returncode == 2 and "--resume drives the sweep as it was made" in again.stderr
