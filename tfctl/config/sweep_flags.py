"""A sweep given on the command line (`tfctl sweep --grid lr=0.1,0.01 --zip seed=1,2 --random
lr=loguniform:0.0001:0.1 --samples 4`): the same section the file's `sweep:` is, checked by the
same rules, its problems named by the flag that gave them.

Flags replace what the file's `sweep:` varies (its `grid`, `zip` and `random`, with `samples` and
`seed`); its `max_parallel` and `retries` stay unless `--max-parallel` is given.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from tfctl.config.base import Doc
from tfctl.config.params import NAME
from tfctl.config.sweep import Draw, SweepSpec
from tfctl.config.sweep_keys import _sweep, check_names
from tfctl.errors import ConfigError, UsageError

FLAG_OF = {"grid": "--grid", "zip": "--zip", "random": "--random", "samples": "--samples", "seed": "--seed"}


def _scalar(text: str) -> Any:
    """A value as the file would read it: `0.01` a number, `true` a boolean, `adam` text."""
    try:
        value = yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (str, int, float, bool)) else text


def _split(flag: str, given: str) -> tuple[str, str]:
    name, equals, rest = given.partition("=")
    if not equals or not NAME.fullmatch(name) or not rest:
        example = "lr=loguniform:0.0001:0.1" if flag == "--random" else "lr=0.1,0.01"
        raise UsageError(f"{flag} {given}: expected NAME=VALUES", hint=f"e.g. {flag} {example}")
    return name, rest


def _distribution(given: str) -> dict[str, list[Any]]:
    """`loguniform:0.0001:0.1`, `uniform:0:1`, `choice:adam,sgd` as `random:` writes them."""
    kind, _, rest = given.partition(":")
    if kind not in {d.value for d in Draw}:
        kinds = ", ".join(d.value for d in Draw)
        raise UsageError(
            f"--random: unknown distribution `{kind}`", hint=f"use one of {kinds}, e.g. loguniform:0.0001:0.1"
        )
    values = rest.split(",") if kind == Draw.CHOICE.value else rest.split(":")
    return {kind: [_scalar(v) for v in values]}


def section(
    grid: Sequence[str], zipped: Sequence[str], drawn: Sequence[str], samples: int | None, seed: int | None
) -> dict[str, Any]:
    """The flags as the mapping a file's `sweep:` would be (empty: no flag varies anything)."""
    out: dict[str, Any] = {}
    for key, flag, items in (("grid", "--grid", grid), ("zip", "--zip", zipped)):
        for given in items:
            name, rest = _split(flag, given)
            out.setdefault(key, {})[name] = [_scalar(v) for v in rest.split(",")]
    for given in drawn:
        name, rest = _split("--random", given)
        out.setdefault("random", {})[name] = _distribution(rest)
    if samples is not None:
        out["samples"] = samples
    if seed is not None:
        out["seed"] = seed
    return out


def flagged_spec(
    path: Path, given: Mapping[str, Any], file_spec: SweepSpec | None, params: Mapping[str, Any]
) -> SweepSpec:
    """The sweep the flags (`section`) make, over the file's `max_parallel` and `retries`; every
    problem named by its flag (`--grid lr: ...`), as one ConfigError."""
    doc = Doc(path)
    spec = _sweep(doc, "sweep", dict(given))
    if not doc.problems:
        check_names(doc, spec, params)
    if doc.problems:
        raise ConfigError([dataclasses.replace(p, key_path=_flag_path(p.key_path)) for p in doc.problems])
    kept = file_spec or SweepSpec()
    return dataclasses.replace(spec, max_parallel=kept.max_parallel, retries=kept.retries)


def _flag_path(key_path: str) -> str:
    """`sweep.grid.lr` as the flag that gave it: `--grid lr`."""
    parts = key_path.split(".")
    if len(parts) >= 2 and parts[1] in FLAG_OF:
        return " ".join([FLAG_OF[parts[1]], *parts[2:3]])
    return "--grid/--zip/--random"
