"""A cluster file's `params:`: put into the other keys before they are validated, overridden by
`--set`, recorded with the run and given again to its resubmission; bad ones named with a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfctl.config.loader import parse_config
from tfctl.config.params import overrides
from tfctl.errors import ConfigError, UsageError

FILE = Path("cluster.yaml")
BASE = """\
name: p
params: {lr: 0.010, steps: 100, opt: adam, gpus: 2, fast: true, host: gpu1}
command: "python train.py --lr={params.lr} --steps {params.steps} --opt={params.opt} --fast={params.fast}"
env: {LR: "{params.lr}", STEPS: "{params.steps}"}
jobs:
  worker:
    hosts: ["{params.host}:2222", "b:2222"]
    gpus: "{params.gpus}"
"""


def parsed(text: str = BASE, given: dict | None = None):
    return parse_config(text, FILE, given)


@pytest.mark.parametrize(
    ("given", "command", "env", "gpus", "hosts"),
    [
        (None, "--lr=0.010 --steps 100 --opt=adam --fast=true", {"LR": "0.010", "STEPS": "100"}, 2, "gpu1"),
        ({"lr": 0.5}, "--lr=0.5 --steps 100 --opt=adam --fast=true", {"LR": "0.5", "STEPS": "100"}, 2, "gpu1"),
        (overrides(["lr=1e-3"]), "--lr=1e-3 --steps 100", {"LR": "1e-3", "STEPS": "100"}, 2, "gpu1"),
        (overrides(["gpus=1", "host=gpu9", "fast=false"]), "--fast=false", {"LR": "0.010", "STEPS": "100"}, 1, "gpu9"),
        ({"lr": 0.01}, "--lr=0.010 ", {"LR": "0.010", "STEPS": "100"}, 2, "gpu1"),  # the default keeps its text
    ],
)
def test_parameters_are_put_in_before_validation(given, command, env, gpus, hosts) -> None:
    config = parsed(given=given)
    assert command in config.command
    assert dict(config.env) == env
    assert config.jobs["worker"].gpus == gpus  # a placeholder alone takes the parameter's type
    assert config.jobs["worker"].addresses[0].host == hosts


def test_the_run_keeps_the_values_it_ran_with() -> None:
    config = parsed(given=overrides(["lr=0.5", "opt=sgd"]))
    assert dict(config.params) == {"lr": 0.5, "steps": 100, "opt": "sgd", "gpus": 2, "fast": True, "host": "gpu1"}
    assert dict(parsed().params)["lr"] == 0.01
    assert dict(parse_config("name: x\ncommand: x\njobs: {worker: [a:1]}\n", FILE).params) == {}


@pytest.mark.parametrize(
    ("text", "given", "expected"),
    [
        (
            BASE.replace("{params.opt}", "{params.optimizer}"),
            None,
            ["command: `{params.optimizer}` names no parameter"],
        ),
        ("name: x\ncommand: 'x {params.lr}'\njobs: {worker: [a:1]}\n", None, ["(declared: none"]),
        (BASE, {"lrr": 0.5}, ["params: --set lrr: no parameter `lrr` in `params:` (it has lr, steps"]),
        (BASE.replace("params: {", "params: {2fast: 1, "), None, ["params.2fast: `2fast` is not a parameter name"]),
        (BASE.replace("params: {", "params: {sizes: [1, 2], "), None, ["params.sizes: expected a number, a string"]),
        ("name: x\nparams: [1]\ncommand: x\njobs: {worker: [a:1]}\n", None, ["params: expected a mapping"]),
        (BASE.replace('gpus: "{params.gpus}"', 'gpus: "{params.opt}"'), None, ["jobs.worker.gpus"]),
    ],
)
def test_bad_parameters_are_named_with_a_fix(text: str, given, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        parsed(text, given)
    message = caught.value.message
    assert all(part in message for part in expected), message
    assert "fix:" in message


def test_a_parameter_in_a_command_is_one_shell_word_and_elsewhere_as_written() -> None:
    config = parsed(given=overrides(["opt=two words; rm -rf x"]))
    assert "--opt='two words; rm -rf x' " in config.command
    text = BASE.replace('STEPS: "{params.steps}"', 'STEPS: "{params.steps}", OPT: "use {params.opt}"')
    assert parsed(text, overrides(["opt=two words"])).env["OPT"] == "use two words"


def test_a_parameter_s_braces_are_its_own_text_not_placeholders() -> None:
    config = parsed(given=overrides(["opt={run_id}"]))
    assert "--opt='{{run_id}}'" in config.command  # rendered per task as the text `{run_id}`, quoted
    text = BASE.replace("opt: adam", "opt: '2.0'")
    assert parsed(text, overrides(["opt=2.10"])).params["opt"] == "2.10"  # a text parameter stays text


def test_a_doubled_brace_is_literal_text() -> None:
    config = parsed(BASE.replace("--opt={params.opt}", "--opt={params.opt} {{params.opt}}"))
    assert "--opt=adam {{params.opt}}" in config.command


@pytest.mark.parametrize("bad", ["lr", "=1", "2x=1", "a b=1"])
def test_a_bad_set_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="NAME=VALUE"):
        overrides([bad])


def test_set_reads_values_as_yaml_does() -> None:
    assert overrides(["a=0.01", "b=true", "c=adam", "d=", "e=[1, 2]"]) == {
        "a": (0.01, "0.01"),
        "b": (True, "true"),
        "c": ("adam", "adam"),
        "d": ("", ""),
        "e": ("[1, 2]", "[1, 2]"),
    }


def test_a_resubmission_reads_the_kept_file_with_the_run_s_parameters(tmp_path: Path) -> None:
    from tfctl.controller.live.resubmit import recorded_config
    from tfctl.controller.start.plan import drafted
    from tfctl.runs import transitions
    from tfctl.runs.store import RunStore

    path = tmp_path / "cluster.yaml"
    path.write_text(
        BASE.replace('["{params.host}:2222", "b:2222"]', "[localhost:2222]").replace('    gpus: "{params.gpus}"\n', "")
    )
    config = parse_config(path.read_text(), path, overrides(["lr=0.5"]))
    store = RunStore(tmp_path / "home")
    run = drafted(config, store, "p-1", None)
    assert run.record.params["lr"] == 0.5
    transitions.claim(store, run.record, None)
    transitions.keep_cluster_file(store, "p-1", config.source)
    path.write_text(path.read_text().replace("lr: 0.010", "lr: 0.9"))  # edited after the start: changes nothing
    again = recorded_config(store, store.load("p-1"))
    assert again.command == config.command and "--lr=0.5" in (again.command or "")
    typed = parse_config(path.read_text(), path, overrides(["lr=0.50"]))  # replayed as typed, not as 0.5
    run = drafted(typed, store, "p-2", None)
    transitions.claim(store, run.record, "p-1")  # (p-1 counts as over: the rule is not what this tests)
    transitions.keep_cluster_file(store, "p-2", typed.source)
    assert "--lr=0.50 " in (recorded_config(store, store.load("p-2")).command or "")


def test_the_kubernetes_export_runs_the_command_with_the_values() -> None:
    from tfctl.kube.tfjob import to_yaml

    text = BASE.replace('["{params.host}:2222", "b:2222"]', "[a:2222, b:2222]").replace(
        '    gpus: "{params.gpus}"\n', ""
    )
    text += "kubernetes: {image: 'registry/team/train:{params.opt}'}\n"
    manifest = to_yaml(parsed(text, overrides(["lr=0.5"])))
    assert "registry/team/train:adam" in manifest
    assert "--lr=0.5" in manifest and "{params." not in manifest


def test_up_set_reaches_the_tasks_and_status_and_runs_show_it(tmp_path: Path, home: Path) -> None:
    import json

    from tests.conftest import tfctl

    (tmp_path / "show.py").write_text("import sys\nprint('lr is', sys.argv[1], flush=True)\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "name: setp\nparams: {lr: 0.5, opt: adam}\ngrace_period: 2\n"
        'command: "{python} show.py {params.lr}"\njobs:\n  worker: [localhost]\n'
    )
    up = tfctl("-f", str(cluster), "up", "--set", "lr=0.25", home=home, timeout=60)
    assert up.returncode == 0, up.stderr
    assert "[worker:0] lr is 0.25" in up.stdout
    runs = json.loads(tfctl("-f", str(cluster), "runs", "--json", home=home).stdout)
    assert runs[-1]["params"] == {"lr": 0.25, "opt": "adam"}
    assert "[lr=0.25 opt=adam]" in tfctl("-f", str(cluster), "runs", home=home).stdout
    status = tfctl("-f", str(cluster), "status", home=home).stdout
    assert "params lr=0.25 opt=adam" in status
    assert json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["run"]["params"]["lr"] == 0.25
    page = tmp_path / "report.html"
    assert tfctl("-f", str(cluster), "report", "-o", str(page), home=home).returncode == 0
    assert "<th>params</th><td>lr=0.25 opt=adam</td>" in page.read_text()
    bad = tfctl("-f", str(cluster), "up", "--set", "rate=1", home=home)
    assert bad.returncode == 2 and "no parameter `rate` in `params:` (it has lr, opt)" in bad.stderr
    assert "Traceback" not in bad.stderr
