"""`check` and `up` refuse, before anything starts, what would fail every task seconds after:
a script the command names that is not in the workdir, a module it imports that the tasks'
Python lacks. The pure part (`controller/start/scripts.py`) as tables; the verbs on localhost.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import free_ports, tfctl
from tfctl.controller.start.scripts import script_named, top_imports

NEEDS_STDLIB_LIST = pytest.mark.skipif(
    sys.version_info < (3, 10), reason="Python 3.9 does not list its standard library: imports are not checked"
)


@pytest.mark.parametrize(
    "command, script",
    [
        ("{python} train.py --job_name={job_name}", "train.py"),
        ("python3 -u train.py", "train.py"),
        ("python3.11 -W ignore -X dev src/train.py --x 1", "src/train.py"),
        ("/opt/venv/bin/python train.py", "train.py"),
        ("cd sub && python run.py", "run.py"),
        ("env A=b OMP_NUM_THREADS=1 python a.py", "a.py"),
        ("./train.py --steps 3", "./train.py"),
        ("{python} -m trainer.main", None),
        ("{python} -c 'import x'", None),
        ("python /abs/train.py", None),
        ("python ~/train.py", None),
        ("python $HOME/train.py", None),
        ("python {workdir}/train.py", None),
        ("python train", None),
        ("bash run.sh train.py", None),
        ("torchrun x.py", None),
        ("python 'unclosed", None),
    ],
)
def test_the_script_a_command_runs(command: str, script: str | None) -> None:
    named = script_named(command)
    assert (named and named[0]) == script


@NEEDS_STDLIB_LIST
@pytest.mark.parametrize(
    "source, modules",
    [
        ("import numpy as np\nimport tensorflow as tf\n", ["numpy", "tensorflow"]),
        ("import os, sys, json\nfrom collections import deque\n", []),
        (
            "from __future__ import annotations\nfrom tensorflow.keras import layers\nimport tensorflow\n",
            ["tensorflow"],
        ),
        ("import google.protobuf\nimport yaml\n", ["google", "yaml"]),
        ("try:\n    import ujson\nexcept ImportError:\n    ujson = None\n", []),  # optional: not needed
        ("def main():\n    import numpy\n", []),  # imported only when it runs: not known to be needed
        ("if False:\n    import numpy\n", []),
        ("from . import sibling\n", []),
        ("import numpy\n)(", []),  # does not parse: nothing said of it here
    ],
)
def test_the_modules_a_script_cannot_start_without(source: str, modules: list[str]) -> None:
    assert top_imports(source) == modules


def write(tmp_path: Path, command: str, script: str | None = None, extra: str = "") -> Path:
    (port,) = free_ports(1)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"name: pre\ncommand: {json.dumps(command)}\njobs:\n  worker: [localhost:{port}]\n{extra}")
    if script is not None:
        (tmp_path / "train.py").write_text(script)
    return cluster


def run_id(up: str) -> str:
    return up.split(":", 1)[0].removeprefix("run ")


def said_by_check_and_up(cluster: Path, home: Path) -> tuple[str, str]:
    """What `check` and `up` print, each refusing; `up` keeps no run."""
    check = tfctl("-f", str(cluster), "check", "--no-network", home=home)
    up = tfctl("-f", str(cluster), "up", home=home)
    assert (check.returncode, up.returncode) == (1, 1), check.stderr + up.stderr
    assert "Traceback" not in check.stderr + up.stderr
    assert json.loads(tfctl("runs", "--json", home=home).stdout) == []  # nothing was started, nothing kept
    return check.stderr, up.stderr


def test_a_script_not_in_the_workdir_is_refused_by_check_as_by_up(tmp_path: Path, home: Path) -> None:
    cluster = write(tmp_path, "{python} trian.py --job={job_name}", "print('trained')\n")
    check, up = said_by_check_and_up(cluster, home)
    said = (
        "error: the tasks' script is missing:\n"
        f"  {cluster}: command: runs trian.py, which is not in the workdir {tmp_path} (did you mean train.py?)\n"
        "hint: fix the command, or set `workdir:` to the folder that holds the script (default: the cluster file's)\n"
    )
    assert check == said
    assert up.startswith(f"run {run_id(up)}: 1 task on 1 host\n" + said.split("hint:")[0]), up
    assert said.split("\n")[-2] in up
    fixed = tfctl("-f", str(write(tmp_path, "{python} train.py")), "check", "--no-network", home=home)
    assert fixed.returncode == 0, fixed.stderr


@NEEDS_STDLIB_LIST
def test_a_module_the_tasks_python_lacks_is_refused_by_check_as_by_up(tmp_path: Path, home: Path) -> None:
    script = "import os\nimport tfctl_absent_module\nimport helper\nprint('trained')\n"
    (tmp_path / "helper.py").write_text("")  # the workdir's own module: found there
    cluster = write(tmp_path, "{python} train.py", script)
    check, up = said_by_check_and_up(cluster, home)
    line = "  localhost: tfctl_absent_module (train.py imports it), in "
    for said in (check, up):
        assert "error: the tasks' Python lacks modules their script imports:\n" + line in said, said
        assert "hint: install the packages that provide them into that Python" in said
    (tmp_path / "tfctl_absent_module").mkdir()  # a package of the workdir: now found
    (tmp_path / "tfctl_absent_module" / "__init__.py").write_text("")
    ok = tfctl("-f", str(cluster), "check", "--no-network", home=home)
    assert ok.returncode == 0, ok.stderr


@NEEDS_STDLIB_LIST
def test_modules_are_not_asked_for_where_another_python_may_have_them(tmp_path: Path, home: Path) -> None:
    """setup may install them, PYTHONPATH bring them, and a command that names its own
    interpreter (not `{python}`) runs one preflight does not ask."""
    script = "import tfctl_absent_module\n"
    for command, extra in (
        ("{python} train.py", "setup: ['true']\n"),
        ("{python} train.py", "env: {PYTHONPATH: /opt/mine}\n"),
        ("/opt/other-venv/bin/python train.py", ""),
        ("python3 train.py", ""),
    ):
        cluster = write(tmp_path, command, script, extra)
        done = tfctl("-f", str(cluster), "check", "--no-network", home=home)
        assert done.returncode == 0, (command, extra, done.stderr)
