"""tfctl init: every template lands whole, validates, and never overwrites by surprise."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, tfctl
from tfctl.config.loader import load_config
from tfctl.config.model import CHOSEN_AT_START

TEMPLATES = sorted(p.name for p in (REPO / "templates").iterdir() if (p / "cluster.yaml").is_file())


def test_list_names_every_template(home: Path) -> None:
    listed = tfctl("init", "--list", home=home)
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == TEMPLATES
    assert set(TEMPLATES) == {"between-graph-async", "between-graph-sync", "parameter-server", "multi-worker-mirrored"}


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_is_written_and_its_cluster_file_validates(name: str, tmp_path: Path, home: Path) -> None:
    result = tfctl("init", "--template", name, str(tmp_path / "proj"), home=home)
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in (tmp_path / "proj").iterdir())
    assert {"cluster.yaml", "train.py", "README.md"} <= set(written)
    config = load_config(tmp_path / "proj" / "cluster.yaml")
    assert config.jobs and all(a.host == "localhost" for _, _, a in config.tasks())
    dry = tfctl("-f", str(tmp_path / "proj" / "cluster.yaml"), "up", "--dry-run", home=home)
    assert dry.returncode == 0 and "TF_CONFIG" in dry.stdout


SHIPPED = [*(REPO / "templates").glob("*/cluster.yaml"), *(REPO / "examples").glob("*/cluster*.yaml")]


@pytest.mark.parametrize("path", SHIPPED + [REPO / "cluster.yaml.example"], ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_cluster_files_name_no_port_so_two_of_them_never_collide(path: Path) -> None:
    config = load_config(path)
    assert {a.port for _, _, a in config.tasks()} == {CHOSEN_AT_START}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_files_that_speak_of_resuming_point_at_up_resume(path: Path) -> None:
    text = path.read_text()
    assert "fixed directory" not in text
    if "resum" in text.replace("--resume", ""):
        assert "up --resume" in text


def test_init_refuses_to_overwrite_without_force(tmp_path: Path, home: Path) -> None:
    (tmp_path / "cluster.yaml").write_text("mine\n")
    refused = tfctl("init", str(tmp_path), home=home)
    assert refused.returncode == 2 and "already has cluster.yaml" in refused.stderr
    assert (tmp_path / "cluster.yaml").read_text() == "mine\n"
    forced = tfctl("init", "--force", str(tmp_path), home=home)
    assert forced.returncode == 0 and "name: between-graph-async" in (tmp_path / "cluster.yaml").read_text()


def test_unknown_template_lists_the_valid_ones(tmp_path: Path, home: Path) -> None:
    result = tfctl("init", "-t", "horovod", str(tmp_path), home=home)
    assert result.returncode == 2 and "parameter-server" in result.stderr


def test_init_takes_a_directory_not_a_cluster_file(tmp_path: Path, home: Path) -> None:
    result = tfctl("-f", str(tmp_path / "proj" / "cluster.yaml"), "init", home=home)
    assert result.returncode == 2 and "takes no cluster file" in result.stderr
    assert f"tfctl init {tmp_path / 'proj'}" in result.stderr
    assert not (tmp_path / "proj").exists()
    assert tfctl("init", "-f", "x.yaml", home=home).returncode == 2  # no such option after the verb
