"""Sphinx configuration of tfctl's documentation: MyST Markdown and the Furo theme. The command-line
and key references and the list of errors are plain Markdown generated from the code by `_ext/`
and committed, so they read on GitHub too; the build warns when one is stale. Nothing here fetches
anything over the network."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]

from tfctl import __version__  # noqa: E402

project = "tfctl"
author = "the tfctl authors"
copyright = "the tfctl authors, Apache-2.0"
release = version = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "tfctl_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
nitpicky = True
suppress_warnings: list[str] = []
# The Python API's reference (guide/python.md) is read from its docstrings. Its signatures are
# shown as written (`autodoc_typehints`); tfctl's own types in them link to their entries. The
# standard library's (Path, Mapping, Callable, ...) would link to docs.python.org through
# intersphinx, which needs the network: they are named, unlinked, by `nitpick_ignore_regex`.
# So is the parsed cluster file (`load_cluster`'s result), which no caller builds by hand.
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
nitpick_ignore_regex = [
    ("py:class", r"(os\.PathLike|pathlib\.Path|Path|Mapping|Sequence|Iterator|Callable|Any|IO)(\[.*\])?"),
    ("py:class", r"(str|int|float|bool|None|tuple|list|dict)"),
    ("py:class", r"ClusterConfig|tfctl\.config\.model\.ClusterConfig"),
]
# Docutils' smart quotes turn `--` into an en dash and `'` into a curly quote in running text,
# which command examples and the errors' hints are: copied, they would not run.
smartquotes = False

html_theme = "furo"
html_title = f"tfctl {release}"
html_static_path = ["_static"]
html_css_files = ["tfctl.css"]
html_theme_options = {
    "navigation_with_keys": True,
    "light_css_variables": {"color-brand-primary": "#d9480f", "color-brand-content": "#c2410c"},
    "dark_css_variables": {"color-brand-primary": "#ff8a4c", "color-brand-content": "#ff8a4c"},
}
pygments_style = "friendly"
pygments_dark_style = "monokai"
