"""Validating `sweep:` (`sweep.py` makes the trials): each list of values, each distribution, the
zip's lengths, and the parameters named against the file's `params:` (`check_names`, once that
is read), every problem with its key and fix."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from tfctl.config.base import INVALID, Doc, Section, _whole_number, type_error
from tfctl.config.sweep import MAX_TRIALS, Distribution, Draw, SweepSpec

EXAMPLE = "sweep: {grid: {lr: [0.1, 0.01]}, zip: {seed: [1, 2]}, max_parallel: 2}"
KEY_DOCS = {
    "sweep": "The trials of `tfctl sweep`: values of `params:` to run, crossed, zipped or drawn.",
    "sweep.grid": "Parameter to a list of values; the lists are crossed (every combination is a trial).",
    "sweep.zip": "Parameter to a list of values, all lists of one length, taken together; crossed with `grid`.",
    "sweep.random": "Parameter to `{uniform: [low, high]}`, `{loguniform: [low, high]}` or `{choice: [...]}`.",
    "sweep.samples": "Draws of `random` per grid and zip point.",
    "sweep.seed": "Seed of the draws: the same file makes the same trials.",
    "sweep.max_parallel": "Trials running at once (above 1, the file's addresses must leave their ports unset).",
    "sweep.retries": "Times a failed trial is started again before it counts as failed.",
}


def _values(doc: Doc, path: str, value: Any) -> Any:
    """A non-empty list of numbers, strings or booleans: the values one parameter takes."""
    if not isinstance(value, list) or not value:
        return type_error(doc, path, "a non-empty list of values", value, f"e.g. `{path.rsplit('.', 1)[-1]}: [1, 2]`")
    bad = [i for i, item in enumerate(value) if not isinstance(item, (str, int, float, bool))]
    if bad:
        return type_error(
            doc, f"{path}[{bad[0]}]", "a number, a string or a boolean", value[bad[0]], "list plain values"
        )
    return tuple(value)


def _lists(doc: Doc, path: str, value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        return type_error(doc, path, "a mapping of parameters to lists", value, f"e.g. `{EXAMPLE}`")
    out = {name: _values(doc, f"{path}.{name}", item) for name, item in value.items()}
    return INVALID if INVALID in out.values() else MappingProxyType(out)


def _zip(doc: Doc, path: str, value: Any) -> Any:
    lists = _lists(doc, path, value)
    if lists is INVALID:
        return INVALID
    lengths = {name: len(values) for name, values in lists.items()}
    if len(set(lengths.values())) > 1:
        said = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        return doc.problem(
            path, f"its lists are taken together, so they need one length ({said})", "give each list as many values"
        )
    return lists


def _distribution(doc: Doc, path: str, value: Any) -> Any:
    kinds = ", ".join(f"`{d}`" for d in Draw)
    example = f"`{path.rsplit('.', 1)[-1]}: {{loguniform: [0.0001, 0.1]}}`"
    if not isinstance(value, dict) or len(value) != 1:
        return type_error(doc, path, f"a mapping of one of {kinds} to its values", value, f"e.g. {example}")
    ((kind, given),) = value.items()
    child = f"{path}.{kind}"
    if kind not in {d.value for d in Draw}:
        return doc.problem(child, f"unknown distribution `{kind}`", f"use one of {kinds}, e.g. {example}")
    draw = Draw(kind)
    values = _values(doc, child, given)
    if values is INVALID or draw is Draw.CHOICE:
        return INVALID if values is INVALID else Distribution(draw, values)
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(values) != 2 or len(numbers) != 2 or not numbers[0] < numbers[1]:
        return doc.problem(child, "needs [low, high]: two numbers, low under high", f"e.g. {example}")
    if draw is Draw.LOGUNIFORM and numbers[0] <= 0:
        return doc.problem(child, "a log-uniform draw needs a low above 0", f"e.g. {example}")
    return Distribution(draw, values)


def _random(doc: Doc, path: str, value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        return type_error(doc, path, "a mapping of parameters to distributions", value, f"e.g. `{EXAMPLE}`")
    out = {name: _distribution(doc, f"{path}.{name}", item) for name, item in value.items()}
    return INVALID if INVALID in out.values() else MappingProxyType(out)


class SweepSection(Section):
    """The section's keys, then what spans them: something to vary, each parameter varied once,
    `samples` only with `random`, and no more trials than one sweep runs."""

    def __call__(self, doc: Doc, path: str, value: Any) -> Any:
        spec = super().__call__(doc, path, value)
        if spec is INVALID:
            return INVALID
        assert isinstance(spec, SweepSpec)
        if not spec.names():
            return doc.problem(path, "varies no parameter", f"give it `grid`, `zip` or `random`, e.g. `{EXAMPLE}`")
        varied: dict[str, str] = {}
        for key in ("grid", "zip", "random"):
            for name in getattr(spec, key):
                if name in varied:
                    doc.problem(
                        f"{path}.{key}.{name}", f"`{name}` is varied in `{varied[name]}` already", "vary it once"
                    )
                varied.setdefault(name, key)
        if "samples" in value and not spec.random:
            doc.problem(f"{path}.samples", "draws nothing: the sweep has no `random`", "remove it, or add `random:`")
        if spec.count() > MAX_TRIALS:
            doc.problem(
                path,
                f"makes {spec.count():,} trials, over the {MAX_TRIALS:,} one sweep runs",
                "vary fewer values, or draw fewer `samples`",
            )
        return spec


_sweep = SweepSection(
    {
        "grid": _lists,
        "zip": _zip,
        "random": _random,
        "samples": _whole_number("draws", 1, "e.g. `samples: 8`"),
        "seed": _whole_number("a seed", 0, "e.g. `seed: 0`"),
        "max_parallel": _whole_number("trials at once", 1, "e.g. `max_parallel: 2`"),
        "retries": _whole_number("retries", 0, "e.g. `retries: 1`"),
    },
    SweepSpec,
    EXAMPLE,
)


def check_names(doc: Doc, spec: Any, params: Mapping[str, Any] | None) -> None:
    """Every parameter the sweep varies is one of `params:` (whose value is the default a
    trial's placeholders fall back to)."""
    if not isinstance(spec, SweepSpec) or not isinstance(params, Mapping):
        return
    for key in ("grid", "zip", "random"):
        for name in getattr(spec, key):
            if name not in params:
                known = ", ".join(params) or "none"
                doc.problem(
                    f"sweep.{key}.{name}",
                    f"`{name}` is not a parameter of `params:` (it has {known})",
                    f"declare it with a default: `params: {{{name}: ...}}`, and use it as `{{params.{name}}}`",
                    at=doc.key_nodes.get(f"sweep.{key}.{name}"),
                )
