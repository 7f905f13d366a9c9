"""Runs whose hosts' files were tampered with or grew big: `status` says what it knows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import fake, free_ports, tfctl


def test_a_task_whose_folder_on_its_host_was_deleted_is_lost_saying_why(tmp_path: Path, home: Path) -> None:
    (port,) = free_ports(1)
    cluster = tmp_path / "cluster.yaml"
    command = fake(f"--name w --port {port} --sleep -1")
    cluster.write_text(f"name: gone\njobs:\n  worker:\n    hosts: [localhost:{port}]\n    command: '{command}'\n")
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    try:
        (folder,) = home.glob(f"hosts/*/tasks/{run_id}")
        shutil.rmtree(folder)  # while the task runs
        shown = tfctl("-f", str(cluster), "status", home=home)
        assert shown.returncode == 0 and "lost" in shown.stdout and "pending" not in shown.stdout, shown.stdout
        assert "worker:0 was lost: no trace of it on localhost (its folder there was deleted" in shown.stdout
        (task,) = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
        assert task["state"] == "lost"
    finally:
        assert tfctl("-f", str(cluster), "down", home=home).returncode == 0
