"""One line per cluster-file key of `fields.py` (`TOP_KEYS`, a job's keys, `progress`, `restart`),
for the generated reference (docs/_ext/tfctl_keys.py, which takes each key's type and default
from the dataclass field it fills); `tests/test_docs.py` fails on a key without one.

`<job>` and `<host>` stand for any job or host name. The keys of `ssh`/`hosts`, `kubernetes` and
each backend's settings are documented in their own modules, by a `KEY_DOCS` of the same shape.
"""

from __future__ import annotations

KEY_DOCS: dict[str, str] = {
    "name": "Cluster name (letters, digits, `_.-`); run ids are `<name>-<yyyymmdd-hhmmss>-<4 hex>`.",
    "command": "What every task runs, through `/bin/sh`, with placeholders; required unless every job has one.",
    "python": "Fills `{python}` and runs the host supervisor; a path's directory leads the tasks' `PATH`.",
    "workdir": "Directory the tasks run in (synced to remote hosts); relative to the cluster file.",
    "env": "Extra environment for every task; values are strings and may use placeholders and `{gpus}`.",
    "setup": "Shell commands run once per workdir on the run's hosts, after sync, before any task starts.",
    "notify": "Shell commands run on this machine on each run event, the event as JSON on stdin.",
    "grace_period": "Seconds between SIGTERM and SIGKILL when tasks are stopped.",
    "startup_timeout": "How long a ps may take to listen on its port before `up` gives up and stops everything.",
    "success_policy": "When the job is done: the chief (or worker 0) exits 0 (`chief`), or every worker did.",
    "jobs": "Job name (`chief`, `ps`, `worker`, `evaluator`) to a list of `host[:port]` or a mapping.",
    "jobs.<job>.hosts": "The job's tasks as `host:port` (or just `host`: port chosen at start); index = position.",
    "jobs.<job>.command": "The job's own command, instead of the top-level one.",
    "jobs.<job>.env": "The job's own environment, laid over the top-level `env`.",
    "jobs.<job>.restart": "What happens when one of the job's tasks ends, as Kubeflow's TFJob says it.",
    "jobs.<job>.restart.policy": "`never`, `on-failure` (the default once `restart` is given) or `exit-code`.",
    "jobs.<job>.restart.max_restarts": "Restarts per task before the run fails naming it.",
    "jobs.<job>.restart.backoff": "Seconds a task waits before it is started again.",
    "jobs.<job>.gpus": "GPUs of its own for each task (`CUDA_VISIBLE_DEVICES`); unset: whatever the host has.",
    "jobs.<job>.cpus": "CPU cores of its own for each task (affinity); unset or 0: any core.",
    "ssh": "Defaults for reaching every remote host; unset values come from `~/.ssh/config`.",
    "hosts": "Per-host settings, keyed by the host name the jobs use.",
    "sync": "Copy `workdir` to remote hosts before start; `false` for a shared filesystem.",
    "exclude": "Glob patterns not copied by sync (defaults: VCS directories, caches, virtualenvs).",
    "hang_timeout": "A task still waiting for a peer this long fails the run, diagnosed; unset: `startup_timeout`.",
    "fail_on_ps_exit": "A ps that ends while the job runs fails the job (TF1 workers would hang forever).",
    "lease_timeout": "Tasks of an attached run stop this long after their `up` dies; 0: never.",
    "idle_ps_timeout": "A ps (or other unwatched task) stops on its host this long after its job is over; 0: never.",
    "host_timeout": "A host that answers nothing for this long fails the run, naming it.",
    "progress": "How `status` reads training progress from task output, and what a stall does.",
    "progress.regex": "A regex with a `(?P<step>...)` or `(?P<rate>...)` group; replaces the built-in shapes.",
    "progress.stall_timeout": "No step for this long: the task is `stalled`.",
    "progress.window": "Seconds over which steps/s is measured.",
    "progress.on_stall": "What the run's controller does with a stalled task: `warn`, `fail` or `restart`.",
    "metrics": "The run's result: name to a regex with the value (a group of its name, `value` or the first), `step`.",
    "start_order": "`together` starts every task at once; `ordered` starts the ps, then worker 0, then the rest.",
    "logdir": "Where the tasks write TensorBoard summaries, relative to each task's workdir; may use `{run_id}`.",
    "kubernetes": "The pods of `tfctl export tfjob`; `up` ignores this section.",
    "params": "Named values the other keys use as `{params.NAME}`; `up --set NAME=VALUE` overrides one.",
    "backend": "Which backend runs the tasks; the default, `ssh`, runs them on the hosts each job lists.",
}
