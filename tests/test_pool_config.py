"""The pool file, and a cluster file that asks a pool for hosts instead of listing them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfctl.config.loader import parse_config
from tfctl.config.pool import load_pool, pool_path
from tfctl.errors import ConfigError

POOL = """\
ssh: {user: lab, connect_timeout: 5}
hosts:
  gpu1: {gpus: 4, cpus: 32}
  gpu2: {gpus: [3, 1], tasks: 2, ssh: gpu2-via-bastion, port: 2222}
  localhost:
"""


def write(tmp_path: Path, text: str, name: str = "lab.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_pool_file_says_what_each_host_offers_and_how_it_is_reached(tmp_path: Path) -> None:
    pool = load_pool(write(tmp_path, POOL))
    assert pool.name == "lab" and pool.ssh.user == "lab" and pool.ssh.connect_timeout == 5
    assert list(pool.hosts) == ["gpu1", "gpu2", "localhost"]
    gpu1, gpu2, local = pool.hosts.values()
    assert (gpu1.gpus, gpu1.cpus, gpu1.tasks) == ((0, 1, 2, 3), 32, None)
    assert (gpu2.gpus, gpu2.cpus, gpu2.tasks) == ((1, 3), None, 2)
    assert gpu2.reach.ssh.destination == "gpu2-via-bastion" and gpu2.reach.ssh.port == 2222
    assert (local.gpus, local.cpus, local.tasks) == ((), None, None)


BAD = {
    "no hosts": ("ssh: {user: u}\n", ["lab.yaml:1:1: hosts: missing required key `hosts`", "fix: add `hosts: {gpu1:"]),
    "gpus not a number": (
        "hosts:\n  a: {gpus: many}\n",
        ["2:13: hosts.a.gpus: expected a number of GPUs", "`gpus: 4`"],
    ),
    "gpu listed twice": ("hosts:\n  a: {gpus: [0, 0]}\n", ["hosts.a.gpus[1]: GPU 0 is listed twice"]),
    "negative index": (
        "hosts:\n  a: {gpus: [-1]}\n",
        ["hosts.a.gpus[0]: expected a GPU index (0, 1, ...), found a number (-1)"],
    ),
    "zero cpus": ("hosts:\n  a: {cpus: 0}\n", ["hosts.a.cpus: must be a whole number of CPU cores, 1 or more"]),
    "unknown host key": ("hosts:\n  a: {gpu: 2}\n", ["hosts.a.gpu: unknown key", "gpus"]),
    "unknown top key": ("hosts: {a: {}}\njobs: {}\n", ["jobs: unknown key"]),
    "empty hosts": ("hosts: {}\n", ["hosts: expected a mapping of host names to what each offers"]),
}


@pytest.mark.parametrize("text, said", BAD.values(), ids=list(BAD))
def test_a_bad_pool_file_names_the_line_the_key_and_the_fix(tmp_path: Path, text: str, said: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_pool(write(tmp_path, text))
    message = str(caught.value)
    assert all(s in message for s in said), message


def test_a_missing_pool_says_where_it_was_looked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFCTL_HOME", str(tmp_path))
    path = pool_path("lab")
    assert path == tmp_path / "pools" / "lab.yaml"
    with pytest.raises(ConfigError, match=r"(?s)no such pool file.*create it, e.g. with `hosts:"):
        load_pool(path)
    assert pool_path("shared/lab.yaml", tmp_path / "c") == tmp_path / "c" / "shared" / "lab.yaml"
    assert pool_path("/etc/tfctl/lab.yaml", tmp_path) == Path("/etc/tfctl/lab.yaml")


def test_a_cluster_file_asks_the_pool_for_tasks(tmp_path: Path) -> None:
    text = "name: x\ncommand: python t.py\npool: lab\nplacement: ps_apart\njobs:\n"
    text += "  ps: {count: 1, cpus: 2}\n  worker: {count: 3, gpus: 1, port: 2222}\n"
    config = parse_config(text, tmp_path / "cluster.yaml")
    assert config.pool == "lab" and config.placement == "ps_apart"
    assert {n: (j.count, j.gpus, j.cpus, j.port, j.addresses) for n, j in config.jobs.items()} == {
        "ps": (1, None, 2, None, ()),
        "worker": (3, 1, None, 2222, ()),
    }
