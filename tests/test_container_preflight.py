"""`check` asks the tasks' images what `up` asks them, and refuses what `up` refuses: an image
that is not there, a mount whose folder is not, a host's virtualenv named as the image's Python
without its mount, an image without the modules the script imports. Real podman and the suite's
image (Debian's python3-minimal, no numpy, no TensorFlow: `bench/containers_lab.py`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from bench.containers_lab import IMAGE, Lab
from tests.conftest import free_ports, tfctl
from tfctl.supervisor import containers

GUIDE_HINT = (
    "hint: install them in the image, or name an image that has them (docs/guide/containers.md: building an image)"
)


def boxed(tmp_path: Path, container: str, script: str = "print('trained')\n") -> Path:
    (port,) = free_ports(1)
    (tmp_path / "train.py").write_text(script)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        f"name: boxed\ncommand: '{{python}} train.py'\ncontainer: {container}\njobs: {{worker: [localhost:{port}]}}\n"
    )
    return cluster


def refused_alike(cluster: Path, home: Path, lab: Lab) -> str:
    """`check`'s refusal, which `up` says too; `up` leaves no run and no container."""
    check = tfctl("-f", str(cluster), "check", "--no-network", home=home, timeout=180)
    up = tfctl("-f", str(cluster), "up", home=home, timeout=180)
    assert (check.returncode, up.returncode) == (1, 1), check.stderr + up.stderr
    error = check.stderr[check.stderr.index("error: ") :]
    assert error.split("\nhint:")[0] in up.stderr and error.split("\n")[-2] in up.stderr, (error, up.stderr)
    assert json.loads(tfctl("runs", "--json", home=home).stdout) == []
    assert lab.containers(containers.RUN_LABEL) == []
    return error


def test_an_image_without_what_the_script_imports_is_refused_before_the_start(
    tmp_path: Path, home: Path, podman_lab: Lab
) -> None:
    """The image has Python but not numpy: without this, `up` started the task, which ended at once
    in ModuleNotFoundError. With the suite's virtualenv mounted in as the tasks' Python (where the
    image's Python is the one it was made from) the same script passes."""
    cluster = boxed(tmp_path, f"{{image: {IMAGE}}}", "import numpy\nimport pytest\nprint('trained')\n")
    error = refused_alike(cluster, home, podman_lab)
    assert error == (
        "error: the tasks' Python lacks modules their script imports:\n"
        f"  localhost: numpy, pytest (train.py imports them), in podman image {IMAGE} (/usr/bin/python3)\n"
        f"{GUIDE_HINT}\n"
    )
    if os.path.realpath(sys.executable) != "/usr/bin/python3.11" or sys.prefix == sys.base_prefix:
        return  # the venv's Python would not run in the image
    venv = sys.prefix
    mounted = f"{{image: {IMAGE}, python: {venv}/bin/python, mounts: ['{venv}:{venv}:ro']}}"
    cluster = boxed(tmp_path, mounted, "import pytest\nprint('trained')\n")
    ok = tfctl("-f", str(cluster), "check", "--no-network", home=home, timeout=180)
    assert ok.returncode == 0, ok.stderr
    assert f"in podman image {IMAGE})" in ok.stderr


def test_a_missing_image_and_a_missing_mount_are_refused_by_check_as_by_up(
    tmp_path: Path, home: Path, podman_lab: Lab
) -> None:
    error = refused_alike(boxed(tmp_path, "{image: localhost/not-here:1}"), home, podman_lab)
    assert error.startswith(
        "error: the tasks' containers cannot run:\n"
        "  localhost: image localhost/not-here:1 is not on this host, and pulling it failed: "
    ), error
    absent = tmp_path / "no-such-folder"
    error = refused_alike(boxed(tmp_path, f"{{image: {IMAGE}, mounts: ['{absent}:/data']}}"), home, podman_lab)
    assert error == (
        "error: the tasks' containers cannot run:\n"
        f"  localhost: container.mounts: {absent} does not exist on this host (podman and docker refuse it)\n"
        "hint: see docs/guide/containers.md\n"
    )


def test_a_hosts_virtualenv_named_as_the_images_python_without_its_mount_is_refused(
    tmp_path: Path, home: Path, podman_lab: Lab
) -> None:
    venv = sys.prefix
    error = refused_alike(boxed(tmp_path, f"{{image: {IMAGE}, python: {venv}/bin/python}}"), home, podman_lab)
    assert error.startswith(
        f"error: the tasks' containers cannot run:\n  localhost: the image's {venv}/bin/python does not run: "
    )
    mount = f"mount its folder (container.mounts: [{venv}:{venv}:ro])"
    assert f"; {venv}/bin/python is this host's, not the image's: {mount}\n" in error


def test_dry_run_shows_each_tasks_container(tmp_path: Path, home: Path) -> None:
    cluster = boxed(tmp_path, "{image: localhost/x:1, mounts: ['/data:/data:ro'], options: ['--shm-size=1g']}")
    done = tfctl("-f", str(cluster), "up", "--dry-run", home=home)
    assert done.returncode == 0, done.stderr
    assert (
        "  container: image localhost/x:1 in the first of podman, docker, apptainer the host has; python python3; "
        "the workdir and run folder at their paths; mounts /data:/data:ro; options --shm-size=1g\n"
    ) in done.stdout
