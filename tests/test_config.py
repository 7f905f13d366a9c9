"""Cluster-file validation: every mistake is reported with its place and a fix, all at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfctl.config.loader import load_config, parse_config
from tfctl.config.model import CHOSEN_AT_START, JOB_NAMES, Address, ClusterConfig
from tfctl.errors import ConfigError

FILE = Path("cluster.yaml")
COMMAND = "python train.py --job_name={job_name} --task_index={task_index}"
SMALLEST = f"""\
name: mnist
command: {COMMAND} --ps_hosts={{ps_hosts}} --worker_hosts={{worker_hosts}}
jobs:
  ps: [localhost:2222]
  worker: [localhost:2223, localhost:2224]
"""


def valid(text: str, path: Path = FILE) -> ClusterConfig:
    return parse_config(text, path)


def invalid(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, FILE)
    return caught.value


def with_jobs(jobs: str) -> str:
    """A file valid apart from its (indented) `jobs:` body, so errors land on known lines from 4 on."""
    return f"name: x\ncommand: {COMMAND}\njobs:\n{jobs}"


# (yaml text, substrings the message must contain: place, key path, what is wrong, the fix)
ERRORS = {
    "empty file": ("", ["cluster.yaml:1:1: the file is empty", "fix: start from `tfctl init`"]),
    "comments only": ("# nothing\n", ["cluster.yaml:1:1: the file is empty"]),
    "top level is a list": (
        "- name: x\n",
        [
            "cluster.yaml:1:1: expected a mapping of settings",
            "found a list",
            "fix: write the file as `key: value` lines",
        ],
    ),
    "tab indentation": (
        "name: x\njobs:\n\tworker: [a:1]\n",
        ["cluster.yaml:3:1: invalid YAML: found character '\\t'", "fix: indent with spaces"],
    ),
    "unquoted ipv6": (
        with_jobs("  worker:\n    - [::1]:2222\n"),
        [
            "cluster.yaml:5:8: invalid YAML: expected the node content, but found ':'",
            "fix: check the indentation, and quote",
            '"[::1]:2222"',
        ],
    ),
    "control character": ("name: a\x07\n", ["cluster.yaml:1:8: invalid YAML: special characters are not allowed"]),
    "two documents": (
        "name: x\n---\nname: y\n",
        [
            "cluster.yaml:2:1: invalid YAML",
            "expected a single document",
            "fix: keep one YAML document per cluster file",
        ],
    ),
    "duplicate top-level key": (
        "name: x\nname: y\n" + with_jobs("  worker: [a:1]\n").replace("name: x\n", ""),
        [
            "cluster.yaml:2:1: name: duplicate key `name` (first at line 1)",
            "fix: remove one of them; YAML would silently keep only the last",
        ],
    ),
    "duplicate env key": (
        "env:\n  A: 1\n  A: 2\n" + with_jobs("  worker: [a:1]\n"),
        ["cluster.yaml:3:3: env.A: duplicate key `A` (first at line 2)"],
    ),
    "misspelled command": (
        "comand: x\nname: x\njobs: {worker: [a:1]}\n",
        [
            "cluster.yaml:1:1: comand: unknown key `comand`",
            "fix: did you mean `command`? every one is listed in docs/reference/cluster-file.md",
        ],
    ),
    "timeout alone": (
        "timeout: 30\n",
        [
            "cluster.yaml:1:1: timeout: unknown key `timeout`",
            "fix: did you mean `host_timeout`? also near: hang_timeout, lease_timeout, startup_timeout; "
            "every one is listed in docs/reference/cluster-file.md",
        ],
    ),
    "job for jobs": ("job: {}\n", ["cluster.yaml:1:1: job: unknown key `job`", "did you mean `jobs`?"]),
    "grace for grace_period": (
        "grace: 3\n",
        ["cluster.yaml:1:1: grace: unknown key `grace`", "did you mean `grace_period`?"],
    ),
    "unrelated top-level key": (
        "colour: red\n",
        ["unknown key `colour`", "fix: remove or rename it; every one is listed in docs/reference/cluster-file.md"],
    ),
    "job at top level": (
        "worker: [a:1]\n",
        ["cluster.yaml:1:1: worker: `worker` is a job, not a top-level key", "fix: move it under `jobs:`"],
    ),
    "missing name": (
        f"command: {COMMAND}\njobs: {{worker: [a:1]}}\n",
        ["cluster.yaml:1:1: name: missing required key `name`", "fix: add `name: mnist`"],
    ),
    "missing jobs": (
        "name: x\ncommand: x\n",
        ["cluster.yaml:1:1: jobs: missing required key `jobs`", "fix: add `jobs:`"],
    ),
    "name with a space": (
        "name: my run\ncommand: x\njobs: {worker: [a:1]}\n",
        ["cluster.yaml:1:7: name: `my run` cannot be used", "run ids and directory names", "e.g. `name: my-run`"],
    ),
    "name is a number": (
        "name: 2024\ncommand: x\njobs: {worker: [a:1]}\n",
        [
            "cluster.yaml:1:7: name: expected a string, found a number (2024)",
            'fix: quote it so YAML keeps it as text: `name: "2024"`',
        ],
    ),
    "unknown placeholder": (
        "name: x\ncommand: run {task_idx}\njobs: {worker: [a:1]}\n",
        [
            "cluster.yaml:2:10: command: unknown placeholder `{task_idx}`",
            "fix: did you mean `{task_index}`?",
            "placeholders are {job_name}, {task_index}, {ps_hosts}",
        ],
    ),
    "shell variable in braces": (
        "name: x\ncommand: cd ${HOME}\njobs: {worker: [a:1]}\n",
        ["command: unknown placeholder `{HOME}`", "write `{{` and `}}` for literal braces (e.g. `${{HOME}}`"],
    ),
    "empty placeholder": ("name: x\ncommand: run {}\njobs: {worker: [a:1]}\n", ["command: unknown placeholder `{}`"]),
    "format spec": (
        "name: x\ncommand: run {task_index:02}\njobs: {worker: [a:1]}\n",
        ["cluster.yaml:2:10: command: placeholder `{task_index:02}` has a format spec", "fix: write `{task_index}`"],
    ),
    "conversion": (
        "name: x\ncommand: run {job_name!r}\njobs: {worker: [a:1]}\n",
        ["command: placeholder `{job_name!r}` has a format spec or conversion", "fix: write `{job_name}`"],
    ),
    "malformed braces": (
        "name: x\ncommand: run {task_index\njobs: {worker: [a:1]}\n",
        [
            "cluster.yaml:2:10: command: malformed braces: expected '}' before end of string",
            "fix: placeholders look like `{task_index}`",
        ],
    ),
    "empty command": (
        "name: x\ncommand: ''\njobs: {worker: [a:1]}\n",
        ["cluster.yaml:2:10: command: is empty", "fix: give a value, e.g. `command: python"],
    ),
    "command is a mapping": (
        "name: x\ncommand: {python: x}\njobs: {worker: [a:1]}\n",
        ["cluster.yaml:2:10: command: expected a command string, found a mapping", "fix: quote the whole command"],
    ),
    "bad job command placeholder": (
        "name: x\njobs:\n  worker: {hosts: [a:1], command: 'run {job}'}\n",
        ["cluster.yaml:3:35: jobs.worker.command: unknown placeholder `{job}`"],
    ),
    "command missing for some jobs": (
        "name: x\njobs:\n  worker: {hosts: [a:1], command: x}\n  ps: [a:2]\n  chief: [a:3]\n",
        [
            "cluster.yaml:1:1: command: missing: no top-level `command`,",
            "these jobs have none of their own: chief, ps",
            "fix: add a top-level `command:",
        ],
    ),
    "python is a number": (
        "python: 3.10\n",
        ["cluster.yaml:1:9: python: expected a string, found a number (3.10)", '`python: "3.10"`'],
    ),
    "env boolean": (
        "env:\n  DEBUG: yes\n",
        [
            "cluster.yaml:2:10: env.DEBUG: expected a string or number, found a boolean (`yes`: YAML reads",
            'fix: quote it: `DEBUG: "yes"`',
        ],
    ),
    "env reserved": (
        "env:\n  TF_CONFIG: '{}'\n",
        ["cluster.yaml:2:3: env.TF_CONFIG: `TF_CONFIG` is set by tfctl for every task", "fix: remove it"],
    ),
    "env reserved run id": ("env: {TFCTL_RUN_ID: x}\n", ["env.TFCTL_RUN_ID: `TFCTL_RUN_ID` is set by tfctl"]),
    "env bad name": (
        "env:\n  1X: y\n",
        ["cluster.yaml:2:3: env.1X: `1X` is not a valid environment variable name", "not starting with a digit"],
    ),
    "env empty value": (
        "env:\n  E:\n",
        ["env.E: expected a string or number, found an empty value", '(`E: ""` for empty)'],
    ),
    "env is a list": (
        "env: [A=1]\n",
        ["cluster.yaml:1:6: env: expected a mapping of variable names to values, found a list", "fix: e.g. `env: {"],
    ),
    "job env boolean": (
        "jobs:\n  ps:\n    hosts: [a:1]\n    env: {X: off}\n",
        ["cluster.yaml:4:14: jobs.ps.env.X: expected a string or number, found a boolean", '`X: "off"`'],
    ),
    "grace_period boolean": (
        "grace_period: true\n",
        ["cluster.yaml:1:15: grace_period: expected a number of seconds, found a boolean", "e.g. `grace_period: 10`"],
    ),
    "grace_period with unit": (
        "grace_period: 10s\n",
        ["grace_period: expected a number of seconds, found a string (`10s`)"],
    ),
    "startup_timeout zero": (
        "startup_timeout: 0\n",
        [
            "cluster.yaml:1:18: startup_timeout: must be a number of seconds greater than 0, found 0",
            "fix: e.g. `startup_timeout: 120`",
        ],
    ),
    "startup_timeout infinite": (
        "startup_timeout: .inf\n",
        ["startup_timeout: must be a number of seconds greater than 0, found inf"],
    ),
    "success_policy typo": (
        "success_policy: all_worker\n",
        [
            "cluster.yaml:1:17: success_policy: expected one of chief, all_workers, found a string (`all_worker`)",
            "did you mean `all_workers`?",
        ],
    ),
    "jobs is a list": (
        "jobs: [a:1]\n",
        ["cluster.yaml:1:7: jobs: expected a mapping of job name to addresses, found a list"],
    ),
    "jobs empty": (
        "jobs: {}\n",
        ["cluster.yaml:1:7: jobs: no `worker` or `chief` job", "fix: add `worker: [localhost:2223]`"],
    ),
    "only ps": (with_jobs("  ps: [a:1]\n"), ["cluster.yaml:4:3: jobs: no `worker` or `chief` job"]),
    "workers for worker": (
        with_jobs("  workers: [a:1]\n"),
        [
            "cluster.yaml:4:3: jobs.workers: unknown job `workers`",
            "fix: did you mean `worker`? allowed jobs: chief, ps, worker, evaluator",
        ],
    ),
    "parameter_server for ps": (
        with_jobs("  worker: [a:1]\n  parameter_server: [a:2]\n"),
        ["cluster.yaml:5:3: jobs.parameter_server: unknown job", "did you mean `ps`?"],
    ),
    "master for chief": (
        with_jobs("  master: [a:1]\n"),
        ["jobs.master: unknown job `master`", "did you mean `chief`?"],
    ),
    "job is a string": (
        with_jobs("  worker: localhost:2222\n"),
        [
            "cluster.yaml:4:11: jobs.worker: expected a list of host:port strings, found a string",
            "fix: make it a list: `worker: [localhost:2222]`",
        ],
    ),
    "job is empty": (
        with_jobs("  worker: [a:1]\n  ps: []\n"),
        ["cluster.yaml:5:7: jobs.ps: has no addresses", "fix: add one, e.g. `ps: [localhost:2222]`, or remove `ps`"],
    ),
    "job hosts is a mapping": (
        with_jobs("  worker:\n    hosts: {a: 1}\n"),
        ["cluster.yaml:5:12: jobs.worker.hosts: expected a list of host:port strings, found a mapping"],
    ),
    "job mapping without hosts": (
        with_jobs("  worker:\n    command: x\n"),
        [
            "cluster.yaml:5:5: jobs.worker.hosts: missing required key `hosts`",
            "fix: add `hosts: [localhost:2222]` under `jobs.worker`",
        ],
    ),
    "job mapping unknown key": (
        with_jobs("  worker:\n    hosts: [a:1]\n    host: b\n"),
        [
            "cluster.yaml:6:5: jobs.worker.host: unknown key `host`",
            "fix: did you mean `hosts`? every one is listed in docs/reference/cluster-file.md",
        ],
    ),
    "two chiefs": (
        with_jobs("  chief: [a:1, a:2]\n"),
        [
            "cluster.yaml:4:16: jobs.chief[1]: a cluster has at most 1 `chief` task, found 2",
            "move the others to `worker`",
        ],
    ),
    "two evaluators": (
        with_jobs("  worker: [a:1]\n  evaluator:\n    hosts: [a:2, a:3]\n"),
        [
            "cluster.yaml:6:18: jobs.evaluator.hosts[1]: a cluster has at most 1 `evaluator` task",
            "keep one address under `evaluator`",
        ],
    ),
    "bare port number": (
        with_jobs("  worker: [2222]\n"),
        ["cluster.yaml:4:12: jobs.worker[0]: `2222` is a bare number, not host:port", "fix: write `localhost:2222`"],
    ),
    "missing host": (
        with_jobs("  worker: [':2222']\n"),
        ["jobs.worker[0]: `:2222` has no host", "fix: write `localhost:2222`"],
    ),
    "port zero": (
        with_jobs("  worker: [a:1, b:0]\n"),
        ["cluster.yaml:4:17: jobs.worker[1]: port 0 is out of range (1-65535)", "fix: write `b:2222`"],
    ),
    "port too big": (with_jobs("  worker: [b:65536]\n"), ["jobs.worker[0]: port 65536 is out of range (1-65535)"]),
    "port not a number": (
        with_jobs("  worker: [localhost:http]\n"),
        ["jobs.worker[0]: port `http` is not a number", "fix: write `localhost:2222`"],
    ),
    "host with underscore": (
        with_jobs("  worker: [my_host:1]\n"),
        ["jobs.worker[0]: `my_host` is not a valid hostname or IP address", "no `_` or spaces"],
    ),
    "bad ipv4": (with_jobs("  worker: [300.1.1.1:1]\n"), ["`300.1.1.1` is not a valid hostname or IP address"]),
    "ipv6 without brackets": (
        with_jobs("  worker: ['::1:2222']\n"),
        ["`::1:2222` looks like an IPv6 address without brackets", '"[::1]:2222"'],
    ),
    "bad ipv6": (with_jobs("  worker: ['[zz]:1']\n"), ["`zz` is not a valid IPv6 address"]),
    "address is a mapping": (
        with_jobs("  worker: [{a: 1}]\n"),
        ["jobs.worker[0]: expected a host:port string, found a mapping"],
    ),
    "duplicate address": (
        with_jobs("  ps: [localhost:2222]\n  worker: [localhost:2223, localhost:2222]\n"),
        [
            "cluster.yaml:5:28: jobs.worker[1]: duplicates jobs.ps[0] (localhost:2222)",
            "fix: give every task its own host:port, e.g. `localhost:2224`",
        ],
    ),
    "unsupported tag": (
        "name: !env NAME\n",
        ["cluster.yaml:1:7: name: cannot read a value tagged `!env`", "remove the `!` tag"],
    ),
    "merge key": ("base: &b {name: x}\n<<: *b\n", ["cluster.yaml:2:1: YAML merge keys (`<<`) are not supported"]),
    "recursive alias": ("env: &e [*e]\n", ["cluster.yaml:1:6: env[0]: a YAML alias refers to the value containing it"]),
    "setup is one string": (
        with_jobs("  worker: [a:1]\n") + "setup: pip install -r requirements.txt\n",
        [
            "cluster.yaml:5:8: setup: expected a list of shell commands, found a string",
            'fix: make it a list: `setup: ["pip install -r requirements.txt"]`',
        ],
    ),
    "setup command is a number": (
        with_jobs("  worker: [a:1]\n") + "setup: [make, 42]\n",
        ["cluster.yaml:5:15: setup[1]: expected a string, found a number (42)", "fix: quote it"],
    ),
    "setup with a placeholder": (
        with_jobs("  worker: [a:1]\n") + "setup: ['{python} -m pip install -r requirements.txt']\n",
        [
            "cluster.yaml:5:9: setup[0]: `{python}` is not filled in: setup commands run as written",
            "fix: write the value itself",
        ],
    ),
    "notify is one string": (
        with_jobs("  worker: [a:1]\n") + "notify: mail -s done me\n",
        [
            "cluster.yaml:5:9: notify: expected a list of shell commands, found a string",
            'fix: make it a list: `notify: ["mail -s done me"]`',
        ],
    ),
    "notify with a placeholder": (
        with_jobs("  worker: [a:1]\n") + "notify: ['echo {run_id} | mail me']\n",
        [
            "cluster.yaml:5:10: notify[0]: `{run_id}` is not filled in: notify commands run as written",
            "fix: the event is on the command's stdin as JSON and in its environment: e.g. `$TFCTL_EVENT_RUN_ID`",
        ],
    ),
    "on_stall unknown": (
        with_jobs("  worker: [a:1]\n") + "progress: {on_stall: Fail}\n",
        [
            "cluster.yaml:5:22: progress.on_stall: expected one of warn, fail, restart, found a string (`Fail`)",
            "fix: did you mean `fail`? e.g. `progress: {stall_timeout: 600, on_stall: fail}`",
        ],
    ),
    "on_stall restart without a restart policy": (
        with_jobs("  worker: [a:1]\n") + "progress: {on_stall: restart}\n",
        [
            "progress.on_stall: `restart` restarts a stalled job's tasks within its restart policy, and worker has",
            "fix: give worker one, e.g. `restart: {policy: on-failure, max_restarts: 3}` under `jobs.worker`",
        ],
    ),
    "env unknown placeholder": (
        "env:\n  SHARD: 'part-{task_idx}'\n" + with_jobs("  worker: [a:1]\n"),
        [
            "cluster.yaml:2:10: env.SHARD: unknown placeholder `{task_idx}`",
            "fix: did you mean `{task_index}`? in `env`, placeholders are {job_name}, {task_index}",
            "{logdir}, {gpus}; write `{{` and `}}` for literal braces",
        ],
    ),
    "env malformed braces": (
        "env:\n  JSON: '{\"a\": 1}'\n" + with_jobs("  worker: [a:1]\n"),
        ['cluster.yaml:2:9: env.JSON: unknown placeholder `{"a"', "write `{{` and `}}` for literal braces"],
    ),
    "job env placeholder with format spec": (
        with_jobs("  worker:\n    hosts: [a:1]\n    env: {GPUS: '{gpus:>3}'}\n"),
        ["jobs.worker.env.GPUS: placeholder `{gpus:>3}` has a format spec", "fix: write `{gpus}`"],
    ),
    "env logdir without logdir": (
        "env:\n  OUT: '{logdir}/x'\n" + with_jobs("  worker: [a:1]\n"),
        ["env.OUT: uses `{logdir}`, but the file has no `logdir`"],
    ),
    "CUDA_VISIBLE_DEVICES beside gpus": (
        "env: {CUDA_VISIBLE_DEVICES: '0'}\n"
        + with_jobs("  worker:\n    hosts: [a:1]\n    gpus: 1\n    env: {CUDA_VISIBLE_DEVICES: '1'}\n"),
        [
            "cluster.yaml:1:7: env.CUDA_VISIBLE_DEVICES: tfctl sets it for the tasks of worker, which have `gpus`",
            "fix: remove it; to hide the GPUs from a job, give it `gpus: 0`",
            "cluster.yaml:8:11: jobs.worker.env.CUDA_VISIBLE_DEVICES: job `worker` has `gpus`, so tfctl sets this",
        ],
    ),
    "gpus not a count": (
        with_jobs("  worker: {hosts: [a:1], gpus: two}\n"),
        ["cluster.yaml:4:32: jobs.worker.gpus: must be a whole number of GPUs per task", "fix: e.g. `gpus: 1`"],
    ),
    "count without a pool or slurm": (
        with_jobs("  worker: {count: 2}\n"),
        [
            "jobs.worker.count: `count` asks for tasks to be placed, and nothing here places them",
            "fix: add `pool: NAME` (or `backend: slurm`), or list the addresses",
        ],
    ),
    "pool with listed hosts": (
        with_jobs("  worker: [a:1]\n") + "pool: lab\n",
        ["jobs.worker: lists hosts, but the pool places the tasks", "fix: say how many: `worker: {count: 1}`"],
    ),
    "pool job without count": (
        with_jobs("  worker: {gpus: 1}\n") + "pool: lab\n",
        ["jobs.worker: has no `count`: with `pool:` a job says how many tasks", "fix: e.g. `jobs: {ps: {count: 1}"],
    ),
    "pool beside hosts": (
        with_jobs("  worker: {count: 1}\n") + "pool: lab\nhosts: {a: {user: u}}\n",
        ["hosts: the pool file says how each host is reached", "fix: move it to the pool file, or remove `pool:`"],
    ),
    "placement without pool": (
        with_jobs("  worker: [a:1]\n") + "placement: ps_apart\n",
        ["placement: places tasks on a pool's hosts, and there is no `pool:`", "fix: add `pool: lab`"],
    ),
    "unknown placement": (
        with_jobs("  worker: {count: 1}\n") + "pool: lab\nplacement: spread\n",
        ["placement: ", "together"],
    ),
    "pool on slurm": (
        with_jobs("  worker: {count: 1}\n") + "pool: lab\nbackend: slurm\n",
        ["pool: asks a pool for hosts, but Slurm picks the nodes", "fix: remove `pool:`, or `backend: slurm`"],
    ),
    "slurm job with hosts": (
        with_jobs("  worker: {hosts: [a:1], count: 2}\n") + "backend: slurm\n",
        ["jobs.worker.hosts: lists hosts, but Slurm picks the nodes", "fix: remove `hosts:`; keep `count:`"],
    ),
    "slurm job without count": (
        with_jobs("  worker: [a:1]\n") + "backend: slurm\n",
        ["jobs.worker: has no `count`: on Slurm a job says how many tasks", "fix: e.g. `jobs: {ps: {count: 1"],
    ),
    "slurm section on ssh": (
        with_jobs("  worker: [a:1]\n") + "slurm: {time: 1h}\n",
        ["slurm: is set, but the backend is ssh", "slurm.time: is not a Slurm time limit: '1h'"],
    ),
    "negative cpus": (
        with_jobs("  worker: {hosts: [a:1], cpus: -2}\n"),
        ["jobs.worker.cpus: must be a whole number of CPU cores per task, 0 or more", "fix: e.g. `cpus: 1`"],
    ),
    "host no job uses": (
        with_jobs("  worker: [h1, localhost]\n") + "hosts:\n  zz: {}\n",
        ["hosts.zz: unknown host `zz`", "allowed hosts (those used in `jobs`): h1, localhost"],
    ),
    "metric regex that does not compile": (
        with_jobs("  worker: [a:1]\n") + "metrics: {accuracy: 'acc ([0-9.]+'}\n",
        ["cluster.yaml:5", "metrics.accuracy: is not a valid regular expression", "fix: e.g. `metrics: {accuracy:"],
    ),
    "metric regex without a value group": (
        with_jobs("  worker: [a:1]\n") + "metrics: {loss: 'loss \\S+ at (?P<step>\\d+)'}\n",
        ["metrics.loss: has no group for the value: write `(?P<loss>...)`", "fix: e.g."],
    ),
    "metrics not a mapping": (
        with_jobs("  worker: [a:1]\n") + "metrics: [accuracy]\n",
        ["metrics: expected a mapping of metric names to regexes", "fix: e.g. `metrics: {accuracy:"],
    ),
}


@pytest.mark.parametrize("text, expected", list(ERRORS.values()), ids=list(ERRORS))
def test_error_names_place_and_fix(text: str, expected: list[str]) -> None:
    error = invalid(text)
    message = str(error)
    for part in expected:
        assert part in message
    assert error.exit_code == 2
    assert all(p.line is not None and p.column is not None and p.fix for p in error.problems)


def test_an_unknown_key_names_the_near_keys_not_all_of_them() -> None:
    reference = "docs/reference/cluster-file.md"
    error = invalid("comand: x\ncolour: red\n" + with_jobs("  worker: {hosts: [a:1], gpu: 1}\n"))
    fixes = [p.fix or "" for p in error.problems]
    unknown = [fix for fix in fixes if reference in fix]
    assert len(unknown) == 3 and not any("workdir" in fix or "startup_timeout" in fix for fix in unknown)
    assert (Path(__file__).resolve().parents[1] / reference).is_file()


def test_all_problems_are_reported_in_file_order() -> None:
    """One run shows everything, so the user does not fix one mistake per invocation."""
    error = invalid("name: a b\ngrace_period: 0\njobs:\n  workers: [a:1]\n  ps: [2222]\n")
    assert [(p.line, p.key_path) for p in error.problems] == [
        (1, "command"),
        (1, "name"),
        (2, "grace_period"),
        (4, "jobs.workers"),
        (5, "jobs.ps[0]"),
    ]
    assert str(error).startswith("5 problems in cluster.yaml\n")


def test_smallest_file() -> None:
    config = valid(SMALLEST)
    assert config.name == "mnist"
    assert config.path == FILE
    assert list(config.jobs) == ["ps", "worker"]
    assert config.jobs["worker"].addresses == (Address("localhost", 2223), Address("localhost", 2224))
    assert config.tasks() == [
        ("ps", 0, Address("localhost", 2222)),
        ("worker", 0, Address("localhost", 2223)),
        ("worker", 1, Address("localhost", 2224)),
    ]
    assert config.command_for("worker").endswith("--worker_hosts={worker_hosts}")
    assert (config.python, config.workdir, dict(config.env)) == (None, None, {})
    assert (config.grace_period, config.startup_timeout, config.success_policy) == (10.0, 120.0, "chief")


def test_jobs_follow_job_names_order_not_file_order() -> None:
    """TF_CONFIG, tables and start phases rely on one fixed order."""
    config = valid(with_jobs("  evaluator: [a:4]\n  worker: [a:3]\n  ps: [a:2]\n  chief: [a:1]\n"))
    assert tuple(config.jobs) == JOB_NAMES
    assert [job.name for job in config.jobs.values()] == list(JOB_NAMES)


def test_mapping_jobs_with_own_command_and_env() -> None:
    config = valid(
        "name: x\n"
        "env: {A: top, B: top}\n"
        "jobs:\n"
        "  ps:\n"
        "    hosts: [a:1]\n"
        "    command: run-ps {task_index}\n"
        "    env: {B: ps}\n"
        "  worker:\n"
        "    hosts: [a:2]\n"
        "    command: run-worker\n"
    )
    assert config.command is None
    assert config.command_for("ps") == "run-ps {task_index}"
    assert config.command_for("worker") == "run-worker"
    assert config.env_for("ps") == {"A": "top", "B": "ps"}
    assert config.env_for("worker") == {"A": "top", "B": "top"}
    with pytest.raises(TypeError):
        config.jobs["ps"].env["B"] = "changed"  # type: ignore[index]


def test_devices_per_task_are_kept_per_job() -> None:
    config = valid(with_jobs("  ps: {hosts: [a:1], gpus: 0}\n  worker: {hosts: [a:2], gpus: 2, cpus: 4}\n"))
    assert (config.jobs["ps"].gpus, config.jobs["ps"].cpus) == (0, None)
    assert (config.jobs["worker"].gpus, config.jobs["worker"].cpus) == (2, 4)


def test_env_values_keep_braces_for_each_task_to_fill() -> None:
    env = "env:\n  A: 'w{task_index} on {gpus}'\n  B: '${{HOME}}'\n  C: plain\n"
    config = valid(env + with_jobs("  worker: [a:1]\n"))
    assert dict(config.env) == {"A": "w{task_index} on {gpus}", "B": "${{HOME}}", "C": "plain"}


def test_ipv6_and_ip_addresses() -> None:
    config = valid(with_jobs("  worker: ['[::1]:2222', 10.0.0.5:2222, '[::1]:2223']\n"))
    addresses = config.jobs["worker"].addresses
    assert addresses == (Address("::1", 2222), Address("10.0.0.5", 2222), Address("::1", 2223))
    assert str(addresses[0]) == "[::1]:2222"


def test_hosts_without_ports_have_theirs_chosen_at_start() -> None:
    """`gpu1` twice is two tasks, each to get its own port; written ports stay as they are."""
    config = valid(with_jobs("  ps: [gpu1]\n  worker: [gpu1, gpu1:2300, gpu2, '[::1]']\n"))
    assert config.jobs["worker"].addresses == (
        Address("gpu1", CHOSEN_AT_START),
        Address("gpu1", 2300),
        Address("gpu2", CHOSEN_AT_START),
        Address("::1", CHOSEN_AT_START),
    )
    assert str(config.jobs["ps"].addresses[0]) == "gpu1:<chosen at start>"
    assert config.ports_to_choose() == {"::1": 1, "gpu1": 2, "gpu2": 1}
    assert config.ports_written("gpu1") == [2300] and config.ports_written("gpu2") == []
    filled = config.with_ports({"gpu1": [20001, 20002], "gpu2": [20001], "::1": [20003]})
    assert [str(a) for _, _, a in filled.tasks()] == [
        "gpu1:20001",
        "gpu1:20002",
        "gpu1:2300",
        "gpu2:20001",
        "[::1]:20003",
    ]
    assert filled.ports_to_choose() == {}


def test_a_written_port_still_may_not_repeat_beside_hosts_without_ports() -> None:
    assert "duplicates jobs.worker[1]" in str(invalid(with_jobs("  worker: [a, a:2222, a, a:2222]\n")))


def test_loopback_spellings_are_different_hosts() -> None:
    """No resolving: `localhost` and `127.0.0.1` on the same port are not reported as duplicates."""
    config = valid(with_jobs("  worker: [localhost:2222, 127.0.0.1:2222, '[::1]:2222']\n"))
    assert len(config.jobs["worker"].addresses) == 3


def test_env_numbers_become_text_as_written() -> None:
    config = valid("name: x\ncommand: x\nenv:\n  PORT: 8080\n  LR: 0.10\n  NAME: y\njobs: {worker: [a:1]}\n")
    assert dict(config.env) == {"PORT": "8080", "LR": "0.10", "NAME": "y"}


def test_options_are_converted() -> None:
    config = valid(
        SMALLEST + "python: /opt/venv/bin/python\ngrace_period: 3\nstartup_timeout: 0.5\nsuccess_policy: all_workers\n"
    )
    assert config.python == "/opt/venv/bin/python"
    assert config.grace_period == 3.0 and isinstance(config.grace_period, float)
    assert config.startup_timeout == 0.5
    assert config.success_policy == "all_workers"


def test_setup_commands_are_kept_as_written() -> None:
    config = valid(SMALLEST + "setup:\n  - . .venv/bin/activate\n  - 'pip install -r req.txt && echo ${HOME}'\n")
    assert config.setup == (". .venv/bin/activate", "pip install -r req.txt && echo ${HOME}")
    assert valid(SMALLEST).setup == ()


def test_metrics_are_kept_as_name_to_regex_and_default_to_none() -> None:
    assert dict(valid(SMALLEST).metrics) == {}
    config = valid(SMALLEST + "metrics:\n  accuracy: 'test acc (?P<accuracy>[0-9.]+) @(?P<step>\\d+)'\n")
    assert dict(config.metrics) == {"accuracy": r"test acc (?P<accuracy>[0-9.]+) @(?P<step>\d+)"}


def test_notify_and_on_stall_are_read_with_their_defaults() -> None:
    config = valid(SMALLEST + "notify: ['curl -d @- https://chat.example.com/hook']\nprogress: {on_stall: fail}\n")
    assert config.notify == ("curl -d @- https://chat.example.com/hook",) and config.progress.on_stall == "fail"
    assert valid(SMALLEST).notify == () and valid(SMALLEST).progress.on_stall == "warn"


def test_literal_braces_are_not_placeholders() -> None:
    """`{{`/`}}` are kept verbatim; rendering turns them into single braces later."""
    config = valid("name: x\ncommand: echo ${{HOME}} {task_index}\njobs: {worker: [a:1]}\n")
    assert config.command == "echo ${{HOME}} {task_index}"


def test_workdir_is_relative_to_the_cluster_file(tmp_path: Path) -> None:
    """The same file works whatever directory tfctl is started from."""
    (tmp_path / "data").mkdir()
    config = valid(SMALLEST + "workdir: data\n", tmp_path / "cluster.yaml")
    assert config.workdir == (tmp_path / "data").resolve()
    assert config.workdir.is_absolute()


@pytest.mark.parametrize("workdir, wrong", [("missing", "does not exist"), ("file", "is not a directory")])
def test_workdir_must_be_a_directory(tmp_path: Path, workdir: str, wrong: str) -> None:
    """The error shows the resolved path, since that is where tfctl looked."""
    (tmp_path / "file").write_text("")
    path = tmp_path / "cluster.yaml"
    with pytest.raises(ConfigError) as caught:
        parse_config(SMALLEST + f"workdir: {workdir}\n", path)
    message = str(caught.value)
    assert f"{path}:6:10: workdir: " in message
    assert f"{(tmp_path / workdir).resolve()} {wrong}" in message


def test_load_config_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(SMALLEST)
    assert load_config(path).name == "mnist"


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "nope.yaml")
    assert caught.value.exit_code == 2
    [problem] = caught.value.problems
    assert problem.file == tmp_path / "nope.yaml"
    assert "no such cluster file" in problem.message
    assert problem.fix == "create one with `tfctl init`, or pass -f FILE"


def test_load_config_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_import_stays_light() -> None:
    """`tfctl --help` must not pay for TensorFlow, paramiko or rich."""
    heavy = "('tensorflow', 'paramiko', 'rich')"
    code = f"import sys, tfctl.config.loader; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1]
    )
    assert out.stdout.strip() == "[]"


def test_the_docs_show_what_tfctl_prints_for_its_broken_file(tmp_path: Path) -> None:
    """The guide's config-error example is a real run's output, and stays one."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "guide" / "cluster-file.md").read_text()

    def block(marker: str) -> str:
        after = readme.split(f"<!-- {marker} -->\n", 1)[1]
        return after.split("\n", 1)[1].split("```\n", 1)[0]

    (tmp_path / "cluster.yaml").write_text(block("config-error-file"))
    shown = block("config-error-output")
    assert shown.startswith("$ tfctl up\n")
    result = subprocess.run(
        [sys.executable, "-m", "tfctl", "up"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TFCTL_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "COLUMNS": "1000"},
    )
    assert result.returncode == 2
    assert result.stderr == shown.split("\n", 1)[1]
