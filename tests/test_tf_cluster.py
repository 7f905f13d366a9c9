"""tfctl.tf.tasks: TF_CONFIG, placeholders, shell quoting, task plans, start phases, completion rules.

Pure logic: no process is started except `/bin/sh` in the quoting tests, and TensorFlow itself
in the tests marked `tf` (one of them through `tfctl up`).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, free_ports, tfctl
from tfctl.cluster.control import Phase
from tfctl.config.loader import parse_config
from tfctl.config.model import PLACEHOLDERS, ClusterConfig
from tfctl.tf import tasks as tfc

RUN_ID = "mnist-20261122-183210-1022"

FULL = """\
name: mnist
command: python train.py --job_name={job_name} --task_index={task_index}
jobs:
  evaluator: [localhost:2230]
  worker: [localhost:2223, localhost:2224]
  ps: [localhost:2222, localhost:2221]
  chief: [localhost:2220]
"""
# What TF_CONFIG's `cluster` must be for FULL: every server job, task index = position, and no
# evaluator (TF's sidecar evaluator is not part of the training cluster).
FULL_CLUSTER = {
    "chief": ["localhost:2220"],
    "ps": ["localhost:2222", "localhost:2221"],
    "worker": ["localhost:2223", "localhost:2224"],
}
FULL_TASKS = [("chief", 0), ("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("evaluator", 0)]

EXAMPLE = """\
name: mnist
command: python train.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} --worker_hosts={worker_hosts}
jobs:
  ps: [localhost:2222]
  worker: [localhost:2223, localhost:2224]
"""


def config(text: str, path: Path = Path("/srv/cluster/cluster.yaml")) -> ClusterConfig:
    return parse_config(text, path)


def plan(cfg: ClusterConfig, python: str = "/usr/bin/python3", cwd: str = "/srv/cluster") -> list:
    hosts = {a.host for _, _, a in cfg.tasks()}
    return tfc.plan_tasks(cfg, RUN_ID, {h: python for h in hosts}, {h: cwd for h in hosts})


def names(tasks) -> tuple[str, ...]:
    return tuple(t.name for t in tasks)


# --- TF_CONFIG -----------------------------------------------------------------------------------


@pytest.mark.parametrize("job,index", FULL_TASKS)
def test_tf_config_for_every_job(job: str, index: int) -> None:
    parsed = json.loads(tfc.tf_config(config(FULL), job, index))
    assert parsed == {"cluster": FULL_CLUSTER, "task": {"type": job, "index": index}}
    assert type(parsed["task"]["index"]) is int


def test_tf_config_cluster_keeps_job_order_and_task_order() -> None:
    parsed = json.loads(tfc.tf_config(config(FULL), "worker", 1))
    assert list(parsed) == ["cluster", "task"]
    assert list(parsed["cluster"]) == ["chief", "ps", "worker"]  # config.JOB_NAMES order, as written or not
    assert parsed["cluster"]["ps"] == ["localhost:2222", "localhost:2221"]  # index = position, never sorted


def test_evaluator_is_not_in_the_cluster_but_has_its_own_task() -> None:
    cfg = config(FULL)
    assert "evaluator" not in tfc.cluster_spec(cfg)
    parsed = json.loads(tfc.tf_config(cfg, "evaluator", 0))
    assert "evaluator" not in parsed["cluster"]
    assert parsed["task"] == {"type": "evaluator", "index": 0}


def test_tf_config_without_chief_or_ps() -> None:
    cfg = config("name: w\ncommand: run\njobs:\n  worker: [a:1, b:2, c:3]\n")
    assert json.loads(tfc.tf_config(cfg, "worker", 2)) == {
        "cluster": {"worker": ["a:1", "b:2", "c:3"]},
        "task": {"type": "worker", "index": 2},
    }


def test_tf_config_ipv6_addresses_are_bracketed() -> None:
    cfg = config('name: v6\ncommand: run\njobs:\n  ps: ["[::1]:2222"]\n  worker: ["[fe80::1]:2223", "10.0.0.5:2224"]\n')
    parsed = json.loads(tfc.tf_config(cfg, "ps", 0))
    assert parsed["cluster"] == {"ps": ["[::1]:2222"], "worker": ["[fe80::1]:2223", "10.0.0.5:2224"]}


def test_tf_config_in_planned_env_is_exact_for_every_task() -> None:
    tasks = plan(config(FULL))
    assert [(t.job, t.index) for t in tasks] == [
        ("chief", 0),
        ("ps", 0),
        ("ps", 1),
        ("worker", 0),
        ("worker", 1),
        ("evaluator", 0),
    ]
    for t in tasks:
        assert json.loads(t.env["TF_CONFIG"]) == {"cluster": FULL_CLUSTER, "task": {"type": t.job, "index": t.index}}


@pytest.mark.tf
@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed (pip install -e '.[tf]')"
)
def test_tensorflow_resolver_reads_tf_config_of_every_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    for task in plan(config(FULL)):
        monkeypatch.setenv("TF_CONFIG", task.env["TF_CONFIG"])
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert resolver.cluster_spec().as_dict() == FULL_CLUSTER, task.name
        assert resolver.task_type == task.job
        assert resolver.task_id == task.index
        if task.job in tfc.SERVER_JOBS:
            # The address the task's own server binds is its own entry of the cluster.
            assert resolver.master() == f"localhost:{task.port}"
            assert resolver.cluster_spec().task_address(task.job, task.index) == task.address
        else:
            assert "evaluator" not in resolver.cluster_spec().jobs


@pytest.mark.tf
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_a_task_retries_a_peer_that_is_not_up_yet_within_a_tenth_of_a_second(tmp_path: Path, home: Path) -> None:
    """gRPC's own first backoff is 1 s; tfctl's tasks start at 100 ms (gRPC jitters it by 20%)."""
    own, peer = free_ports(2)
    probe = REPO / "tests" / "tasks" / "grpc_backoff.py"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: backoff
command: "{{python}} {probe} --own localhost:{own} --peer localhost:{peer}"
env: {{GRPC_TRACE: subchannel, GRPC_VERBOSITY: debug}}
jobs:
  worker: [localhost:{own}]
""")
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0, up.stdout + up.stderr
    logs = tfctl("-f", str(cluster), "logs", home=home).stdout
    assert "probe done" in logs
    backoffs = [int(ms) for ms in re.findall(r"backing off for (\d+) ms", logs)]
    assert backoffs, logs[-2000:]
    assert backoffs[0] <= 120, backoffs


# --- placeholders --------------------------------------------------------------------------------


def test_placeholder_values_cover_every_placeholder() -> None:
    values = tfc.placeholder_values(config(EXAMPLE), "worker", 1, "/usr/bin/python3", RUN_ID)
    assert set(values) == set(PLACEHOLDERS)
    assert values == {
        "job_name": "worker",
        "task_index": "1",
        "ps_hosts": "localhost:2222",
        "worker_hosts": "localhost:2223,localhost:2224",
        "chief_hosts": "",
        "evaluator_hosts": "",
        "python": "/usr/bin/python3",
        "run_id": RUN_ID,
        "logdir": "",
    }


def test_placeholder_host_lists_of_a_full_cluster() -> None:
    values = tfc.placeholder_values(config(FULL), "evaluator", 0, "python3", RUN_ID)
    assert values["chief_hosts"] == "localhost:2220"
    assert values["ps_hosts"] == "localhost:2222,localhost:2221"
    assert values["worker_hosts"] == "localhost:2223,localhost:2224"
    assert values["evaluator_hosts"] == "localhost:2230"
    assert (values["job_name"], values["task_index"]) == ("evaluator", "0")


@pytest.mark.parametrize("name", PLACEHOLDERS)
def test_render_each_placeholder(name: str) -> None:
    values = tfc.placeholder_values(config(FULL), "worker", 1, "/opt/py/bin/python3", RUN_ID)
    rendered = tfc.render_command(f"echo <{{{name}}}>", values)
    assert rendered == f"echo <{shlex.quote(values[name])}>"


def test_render_all_placeholders_of_the_readme_example() -> None:
    values = tfc.placeholder_values(config(EXAMPLE), "worker", 1, "/usr/bin/python3", RUN_ID)
    template = " ".join("{" + p + "}" for p in PLACEHOLDERS)
    assert tfc.render_command(template, values) == (
        f"worker 1 localhost:2222 localhost:2223,localhost:2224 '' '' /usr/bin/python3 {RUN_ID} ''"
    )


def test_render_empty_host_list_is_one_empty_shell_word(tmp_path: Path) -> None:
    values = tfc.placeholder_values(config(EXAMPLE), "ps", 0, "python3", RUN_ID)
    rendered = tfc.render_command("printf '<%s>' --chief_hosts={chief_hosts} {evaluator_hosts}", values)
    assert rendered == "printf '<%s>' --chief_hosts='' ''"
    out = subprocess.run(["/bin/sh", "-c", rendered], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout == "<--chief_hosts=><>"


def test_render_ipv6_host_list_is_quoted_and_survives_the_shell(tmp_path: Path) -> None:
    cfg = config('name: v6\ncommand: run\njobs:\n  ps: ["[::1]:2222"]\n  worker: ["[::1]:2223", "[::1]:2224"]\n')
    values = tfc.placeholder_values(cfg, "worker", 0, "python3", RUN_ID)
    rendered = tfc.render_command("printf '%s\\n' --ps_hosts={ps_hosts} {worker_hosts}", values)
    out = subprocess.run(["/bin/sh", "-c", rendered], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout == "--ps_hosts=[::1]:2222\n[::1]:2223,[::1]:2224\n"


@pytest.mark.parametrize(
    "template,expected",
    [
        ("echo {{}}", "echo {}"),
        ("echo {{job_name}}", "echo {job_name}"),
        ("echo ${{HOME}} {job_name}", "echo ${HOME} worker"),
        ("awk '{{print $1}}' --i={task_index}", "awk '{print $1}' --i=1"),
        ("{{{job_name}}}", "{worker}"),
        ("echo }}{{", "echo }{"),
        ("no placeholders at all", "no placeholders at all"),
        ("", ""),
    ],
)
def test_render_doubled_braces_are_literal(template: str, expected: str) -> None:
    values = tfc.placeholder_values(config(EXAMPLE), "worker", 1, "python3", RUN_ID)
    assert tfc.render_command(template, values) == expected


def test_doubled_braces_reach_the_shell_as_literal_braces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFCTL_BRACE_TEST", "expanded")
    values = tfc.placeholder_values(config(EXAMPLE), "worker", 1, "python3", RUN_ID)
    rendered = tfc.render_command("printf '%s|' ${{TFCTL_BRACE_TEST}} '{{x}}' {job_name}", values)
    out = subprocess.run(["/bin/sh", "-c", rendered], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout == "expanded|{x}|worker|"


# --- shell quoting with hostile values -----------------------------------------------------------

HOSTILE = [
    "; rm -rf /",
    "; rm -rf victim",
    "$(touch pwned)",
    "`touch pwned`",
    "' ; touch pwned ; '",
    '" ; touch pwned ; "',
    "'\"'\"'; touch pwned #",
    "a\ntouch pwned",
    "\ntouch pwned\n",
    "a && touch pwned || touch pwned",
    "| tee pwned",
    "> pwned",
    "< victim",
    "& touch pwned &",
    "$HOME ${PATH} $0 $$ $?",
    "* ? [a-z] ~ ~root",
    "\\; touch pwned \\",
    "#not a comment",
    "-n",
    "",
    " ",
    "\t tab\tand  spaces ",
    "{job_name} {{}}",
    "ünïcödé ☃",
    "x=$(id) y=`id`; exec touch pwned",
]


def test_render_quotes_hostile_values_without_running_them() -> None:
    values = {name: "; rm -rf /" for name in PLACEHOLDERS}
    values["python"] = "$(touch /tmp/x)"
    rendered = tfc.render_command("{python} train.py --job_name={job_name} --ps={ps_hosts}", values)
    assert rendered == "'$(touch /tmp/x)' train.py --job_name='; rm -rf /' --ps='; rm -rf /'"
    assert shlex.split(rendered) == ["$(touch /tmp/x)", "train.py", "--job_name=; rm -rf /", "--ps=; rm -rf /"]


def _sh(rendered: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/bin/sh", "-c", rendered],
        cwd=cwd,
        capture_output=True,
        timeout=10,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
    )


@pytest.mark.parametrize("value", HOSTILE, ids=[repr(v) for v in HOSTILE])
def test_hostile_value_is_printed_literally_and_nothing_runs(value: str, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("still here\n")
    values = {name: "ok" for name in PLACEHOLDERS}
    values["job_name"] = value
    rendered = tfc.render_command("printf '%s\\n' {job_name}", values)
    # Guard first: if quoting were broken the shell would see more than one word, and we stop here
    # before running anything (so `; rm -rf /` can never reach a shell unquoted).
    assert shlex.split(rendered) == ["printf", "%s\\n", value]
    if value == "; rm -rf /":
        return  # proven by the guard above; not worth running even quoted
    result = _sh(rendered, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == value + "\n"
    assert result.stderr == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]  # no `pwned`, nothing else
    assert victim.read_text() == "still here\n"


def test_every_placeholder_with_hostile_values_at_once(tmp_path: Path) -> None:
    (tmp_path / "victim").write_text("x")
    chosen = [
        "$(touch pwned)",
        "`touch pwned`",
        "'; touch pwned; '",
        "a\nb; touch pwned",
        "* ~",
        '"$HOME"',
        "| touch pwned",
        "",
        "; touch pwned #",
    ]
    values = dict(zip(PLACEHOLDERS, chosen))
    template = "printf '%s\\0' " + " ".join("{" + p + "}" for p in PLACEHOLDERS)
    result = _sh(tfc.render_command(template, values), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split("\0")[:-1] == chosen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]


def test_hostile_value_inside_a_flag_and_next_to_literal_text(tmp_path: Path) -> None:
    values = {name: "v" for name in PLACEHOLDERS}
    values["run_id"] = "$(touch pwned)'x\"y"
    result = _sh(tfc.render_command("printf '%s\\n' --dir=/ckpt/{run_id}/model", values), tmp_path)
    assert result.stdout.decode() == "--dir=/ckpt/$(touch pwned)'x\"y/model\n"
    assert list(tmp_path.iterdir()) == []


# --- plan_tasks ----------------------------------------------------------------------------------


def test_plan_every_task_with_host_port_and_command() -> None:
    tasks = plan(config(EXAMPLE))
    assert [(t.name, t.host, t.port) for t in tasks] == [
        ("ps:0", "localhost", 2222),
        ("worker:0", "localhost", 2223),
        ("worker:1", "localhost", 2224),
    ]
    assert tasks[2].command == (
        "python train.py --job_name=worker --task_index=1 --ps_hosts=localhost:2222 "
        "--worker_hosts=localhost:2223,localhost:2224"
    )


def test_plan_env_has_tf_config_unbuffered_python_and_fast_grpc_reconnect() -> None:
    for t in plan(config(EXAMPLE)):
        assert t.env["PYTHONUNBUFFERED"] == "1"
        assert json.loads(t.env["TF_CONFIG"])["task"] == {"type": t.job, "index": t.index}
        assert t.env["TF_GRPC_DEFAULT_OPTIONS"] == "grpc.initial_reconnect_backoff_ms=100"
        assert set(t.env) - {"TFCTL_RUN_ID", "TFCTL_TASK"} == {
            "PYTHONUNBUFFERED",
            "TF_CONFIG",
            "TF_GRPC_DEFAULT_OPTIONS",
        }


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        # Options of the file's own are kept, the fast reconnect joins them.
        ("grpc.keepalive_time_ms=60000", "grpc.keepalive_time_ms=60000,grpc.initial_reconnect_backoff_ms=100"),
        ("a=1, b=2,", "a=1, b=2,grpc.initial_reconnect_backoff_ms=100"),
        # A file that sets the backoff itself (1000 = gRPC's own default) gets exactly that.
        ("grpc.initial_reconnect_backoff_ms=1000", "grpc.initial_reconnect_backoff_ms=1000"),
        ("x=1, grpc.initial_reconnect_backoff_ms = 5", "x=1, grpc.initial_reconnect_backoff_ms = 5"),
    ],
)
def test_grpc_options_of_the_cluster_file_are_kept(own: str, expected: str) -> None:
    cfg = config(EXAMPLE + f"env:\n  TF_GRPC_DEFAULT_OPTIONS: {json.dumps(own)}\n")
    assert {t.env["TF_GRPC_DEFAULT_OPTIONS"] for t in plan(cfg)} == {expected}


def test_plan_user_env_overrides_defaults() -> None:
    cfg = config(EXAMPLE + 'env:\n  PYTHONUNBUFFERED: "0"\n  OMP_NUM_THREADS: 4\n')
    for t in plan(cfg):
        assert t.env["PYTHONUNBUFFERED"] == "0"
        assert t.env["OMP_NUM_THREADS"] == "4"
        assert "TF_CONFIG" in t.env


def test_plan_job_env_overrides_cluster_env() -> None:
    cfg = config("""\
name: m
command: run
env: {A: cluster, B: cluster, PYTHONUNBUFFERED: "x"}
jobs:
  ps:
    hosts: [localhost:2222]
    env: {A: ps-job, C: ps-only}
  worker:
    hosts: [localhost:2223]
    env: {PYTHONUNBUFFERED: "1"}
""")
    ps, worker = plan(cfg)
    assert {k: ps.env[k] for k in ("A", "B", "C", "PYTHONUNBUFFERED")} == {
        "A": "ps-job",
        "B": "cluster",
        "C": "ps-only",
        "PYTHONUNBUFFERED": "x",
    }
    assert {k: worker.env[k] for k in ("A", "B", "PYTHONUNBUFFERED")} == {
        "A": "cluster",
        "B": "cluster",
        "PYTHONUNBUFFERED": "1",
    }
    assert "C" not in worker.env


def test_plan_tf_config_is_tfctls_even_if_env_names_it() -> None:
    # Validation refuses TF_CONFIG in `env`; even a config built around validation cannot override it.
    cfg = config(EXAMPLE)
    from dataclasses import replace
    from types import MappingProxyType

    cfg = replace(cfg, env=MappingProxyType({"TF_CONFIG": "{{}}"}))
    for t in plan(cfg):
        assert json.loads(t.env["TF_CONFIG"])["task"]["type"] == t.job


def test_plan_job_command_overrides_cluster_command() -> None:
    cfg = config("""\
name: m
command: train --job={job_name}
jobs:
  ps:
    hosts: [localhost:2222]
    command: serve --index={task_index}
  worker: [localhost:2223]
""")
    ps, worker = plan(cfg)
    assert ps.command == "serve --index=0"
    assert worker.command == "train --job=worker"


def _make_plan_cwds(cfg: ClusterConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> set:
    from tfctl.controller.start.plan import draft, make_plan

    monkeypatch.setenv("TFCTL_HOME", str(tmp_path / "tfctl-home"))
    return {t.cwd for t in make_plan(draft(cfg, RUN_ID)).record.tasks}


def test_plan_cwd_is_workdir_when_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "code").mkdir()
    cfg = config(EXAMPLE + "workdir: code\n", tmp_path / "cluster.yaml")
    assert _make_plan_cwds(cfg, monkeypatch, tmp_path) == {str((tmp_path / "code").resolve())}


def test_plan_absolute_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    cfg = config(EXAMPLE + f"workdir: {other}\n", tmp_path / "sub" / "cluster.yaml")
    assert _make_plan_cwds(cfg, monkeypatch, tmp_path) == {str(other.resolve())}


def test_plan_cwd_defaults_to_cluster_file_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "proj").mkdir()
    cfg = config(EXAMPLE, tmp_path / "proj" / "cluster.yaml")
    assert _make_plan_cwds(cfg, monkeypatch, tmp_path) == {str((tmp_path / "proj").resolve())}


def test_plan_cwd_of_relative_cluster_path_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = config(EXAMPLE, Path("proj/cluster.yaml"))
    assert _make_plan_cwds(cfg, monkeypatch, tmp_path) == {str((tmp_path / "proj").resolve())}


def test_plan_tasks_cwd_is_per_host() -> None:
    cfg = config("name: m\ncommand: run\njobs:\n  ps: [localhost:2222]\n  worker: [localhost:2223, gpu1:2223]\n")
    tasks = tfc.plan_tasks(
        cfg,
        RUN_ID,
        {"localhost": "python3", "gpu1": "python3"},
        {"localhost": "/home/me/proj", "gpu1": "~/.tfctl/work/x"},
    )
    assert [(t.name, t.cwd) for t in tasks] == [
        ("ps:0", "/home/me/proj"),
        ("worker:0", "/home/me/proj"),
        ("worker:1", "~/.tfctl/work/x"),
    ]


def test_plan_python_placeholder_per_host() -> None:
    cfg = config("""\
name: m
command: "{python} train.py {job_name}"
jobs:
  ps: [localhost:2222]
  worker: [localhost:2223, gpu1:2223, "[fe80::1]:2223"]
""")
    python_for = {"localhost": "/venv/bin/python", "gpu1": "python3", "fe80::1": "/opt/my py/bin/python"}
    tasks = tfc.plan_tasks(cfg, RUN_ID, python_for, {h: "/w" for h in python_for})
    assert [(t.name, t.host, t.command) for t in tasks] == [
        ("ps:0", "localhost", "/venv/bin/python train.py ps"),
        ("worker:0", "localhost", "/venv/bin/python train.py worker"),
        ("worker:1", "gpu1", "python3 train.py worker"),
        ("worker:2", "fe80::1", "'/opt/my py/bin/python' train.py worker"),
    ]
    assert tasks[3].address == "[fe80::1]:2223"


def test_plan_run_id_placeholder() -> None:
    cfg = config("name: m\ncommand: train --ckpt=/tmp/{run_id}/{job_name}{task_index}\njobs:\n  worker: [h:1, h:2]\n")
    assert [t.command for t in plan(cfg)] == [
        f"train --ckpt=/tmp/{RUN_ID}/worker0",
        f"train --ckpt=/tmp/{RUN_ID}/worker1",
    ]


# --- start phases, decisive and essential tasks --------------------------------------------------


def _check_phase_invariants(tasks: list, phases: list) -> None:
    """What every start order must satisfy: each task exactly once; ps and evaluator before the
    chief and workers; an evaluator never waited for; every wait names a task of its own phase."""
    started = [t.name for p in phases for t in p.tasks]
    assert sorted(started) == sorted(t.name for t in tasks)
    assert all(isinstance(p, Phase) and p.tasks for p in phases)
    first_training = min(
        (i for i, p in enumerate(phases) for t in p.tasks if t.job in ("chief", "worker")), default=len(phases)
    )
    for i, p in enumerate(phases):
        assert set(p.wait_listening) <= set(names(p.tasks))
        assert not any(n.startswith("evaluator:") for n in p.wait_listening)
        if any(t.job in ("ps", "evaluator") for t in p.tasks):
            assert i < first_training


def test_start_phases_ps_and_evaluator_first_only_ps_waited_for() -> None:
    tasks = plan(config(FULL))
    phases = tfc.start_phases(tasks, "ordered")
    _check_phase_invariants(tasks, phases)
    assert names(phases[0].tasks) == ("ps:0", "ps:1", "evaluator:0")
    assert phases[0].wait_listening == ("ps:0", "ps:1")
    assert phases[0].wait_limit is None  # a ps that never listens fails the start
    later = [t.name for p in phases[1:] for t in p.tasks]
    assert sorted(later) == ["chief:0", "worker:0", "worker:1"]


def test_start_phases_a_chief_job_starts_with_its_workers() -> None:
    # ParameterServerStrategy's chief coordinates and waits for the workers itself.
    phases = tfc.start_phases(plan(config(FULL)), "ordered")
    assert [names(p.tasks) for p in phases[1:]] == [("chief:0", "worker:0", "worker:1")]
    assert phases[1].wait_listening == () and phases[1].wait_limit is None


def test_start_phases_of_the_example() -> None:
    tasks = plan(config(EXAMPLE))
    phases = tfc.start_phases(tasks, "ordered")
    _check_phase_invariants(tasks, phases)
    assert phases[0].tasks == (tasks[0],) and phases[0].wait_listening == ("ps:0",)
    assert [names(p.tasks) for p in phases] == [("ps:0",), ("worker:0",), ("worker:1",)]


def test_start_phases_workers_only_is_one_phase() -> None:
    tasks = plan(config("name: w\ncommand: run\njobs:\n  worker: [h:1, h:2, h:3]\n"))
    phases = tfc.start_phases(tasks, "ordered")
    _check_phase_invariants(tasks, phases)
    assert len(phases) == 1
    assert names(phases[0].tasks) == ("worker:0", "worker:1", "worker:2")


def test_start_phases_chief_and_workers_without_ps_is_one_phase() -> None:
    tasks = plan(config("name: w\ncommand: run\njobs:\n  worker: [h:1]\n  chief: [h:2]\n"))
    phases = tfc.start_phases(tasks, "ordered")
    _check_phase_invariants(tasks, phases)
    assert [names(p.tasks) for p in phases] == [("chief:0", "worker:0")]


def test_start_phases_evaluator_first_but_never_waited_for() -> None:
    tasks = plan(config("name: w\ncommand: run\njobs:\n  worker: [h:1]\n  evaluator: [h:2]\n"))
    phases = tfc.start_phases(tasks, "ordered")
    _check_phase_invariants(tasks, phases)
    assert [names(p.tasks) for p in phases] == [("evaluator:0",), ("worker:0",)]
    assert phases[0].wait_listening == ()


def test_start_phases_of_no_tasks() -> None:
    assert tfc.start_phases([], "ordered") == []


@pytest.mark.parametrize(
    "jobs,policy,expected",
    [
        ("  chief: [h:1]\n  worker: [h:2, h:3]\n  ps: [h:4]\n", "chief", ["chief:0"]),
        ("  worker: [h:2, h:3]\n  ps: [h:4]\n", "chief", ["worker:0"]),
        ("  chief: [h:1]\n", "chief", ["chief:0"]),
        ("  chief: [h:1]\n  worker: [h:2, h:3]\n  ps: [h:4]\n", "all_workers", ["chief:0", "worker:0", "worker:1"]),
        (
            "  worker: [h:2, h:3, h:5]\n  ps: [h:4]\n  evaluator: [h:6]\n",
            "all_workers",
            ["worker:0", "worker:1", "worker:2"],
        ),
        ("  chief: [h:1]\n  ps: [h:4]\n", "all_workers", ["chief:0"]),
    ],
)
def test_decisive_tasks(jobs: str, policy: str, expected: list[str]) -> None:
    cfg = config(f"name: m\ncommand: run\nsuccess_policy: {policy}\njobs:\n{jobs}")
    assert cfg.success_policy == policy
    assert tfc.decisive_tasks(cfg) == expected


def test_decisive_tasks_default_policy_is_chief() -> None:
    assert tfc.decisive_tasks(config(FULL)) == ["chief:0"]
    assert tfc.decisive_tasks(config(EXAMPLE)) == ["worker:0"]


def test_decisive_tasks_are_planned_task_names() -> None:
    for text in (FULL, EXAMPLE, FULL + "success_policy: all_workers\n"):
        cfg = config(text)
        assert set(tfc.decisive_tasks(cfg)) <= set(names(plan(cfg)))


def test_essential_tasks_are_the_parameter_servers() -> None:
    assert tfc.essential_tasks(plan(config(FULL))) == ["ps:0", "ps:1"]
    assert tfc.essential_tasks(plan(config(EXAMPLE))) == ["ps:0"]
    no_ps = config("name: w\ncommand: run\njobs:\n  worker: [h:1]\n  evaluator: [h:2]\n")
    assert tfc.essential_tasks(plan(no_ps)) == []


def test_listens_for_server_jobs_only() -> None:
    assert {t.name: tfc.listens(t) for t in plan(config(FULL))} == {
        "chief:0": True,
        "ps:0": True,
        "ps:1": True,
        "worker:0": True,
        "worker:1": True,
        "evaluator:0": False,
    }


def test_public_task_addresses_are_flagged_private_ones_not(tmp_path: Path) -> None:
    from tfctl.tf.tasks import exposed_addresses

    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n93.184.216.34 gpu-public  # a comment\n10.1.2.3 gpu-lan\n")
    config = parse_config(
        "name: s\ncommand: x\njobs:\n  ps: [8.8.4.4:2222]\n"
        "  worker: [gpu-public:2222, gpu-lan:2222, localhost:2223, 169.254.1.1:2222, "
        "unknown-name:2222, 192.168.1.5:2222]\n",
        tmp_path / "c.yaml",
    )
    assert exposed_addresses(config, str(hosts)) == ["8.8.4.4:2222", "gpu-public:2222 (93.184.216.34)"]


def test_start_together_is_one_phase_waiting_for_every_server_and_probing_them() -> None:
    tasks = plan(config(FULL))
    (phase,) = tfc.start_phases(tasks, "together")
    assert [t.name for t in phase.tasks] == [t.name for t in tasks]
    assert set(phase.wait_listening) == {"ps:0", "ps:1"}  # the ps; workers are not held to listening
    assert phase.probe and phase.wait_limit is None
    assert tfc.start_phases([], "together") == []
    workers = [t for t in tasks if t.job in ("chief", "worker")]
    (alone,) = tfc.start_phases(workers, "together")
    assert set(alone.wait_listening) == {t.name for t in workers}  # all-reduce: every worker, as ordered


def test_the_default_start_is_together_and_ordered_can_be_asked_for() -> None:
    assert config(FULL).start_order == "together"
    assert config(FULL + "start_order: ordered\n").start_order == "ordered"
