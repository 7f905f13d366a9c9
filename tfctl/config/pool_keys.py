"""A cluster file that asks a pool for hosts: `pool:`, `placement:`, and a job's `count` and `port`.

A job says how many tasks (`count`) and what each needs (`gpus`, `cpus`) instead of where; the
hosts come from placement at start (`tfctl.engine.placement`). `count` and `port` are the same
keys a backend that places tasks itself reads (its own `check` says when they apply there).
"""

from __future__ import annotations

from typing import Any, Mapping

from tfctl.config.base import Doc, Validator, _choice, _found, _string, _whole_number
from tfctl.config.model import JOB_NAMES, PLACEMENTS

EXAMPLE = "pool: lab"
JOB_EXAMPLE = "jobs: {ps: {count: 1}, worker: {count: 2, gpus: 1}}"


def _port(doc: Doc, path: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        return doc.problem(
            path, f"must be a port number (1-65535), found {_found(value, doc.raw(path))}", "e.g. `port: 2222`"
        )
    return value


def _pool(doc: Doc, path: str, value: Any) -> Any:
    text = _string(doc, path, value, EXAMPLE)
    if isinstance(text, str) and not text.strip():
        return doc.problem(path, "is empty", f"name a pool (`{EXAMPLE}`: $TFCTL_HOME/pools/lab.yaml) or a pool file")
    return text


TOP_KEYS: dict[str, Validator] = {
    "pool": _pool,
    "placement": _choice(
        PLACEMENTS,
        "`together` keeps each job's tasks on as few hosts as fit; `ps_apart` keeps the ps off workers' hosts",
    ),
}
JOB_KEYS: dict[str, Validator] = {
    "count": _whole_number("tasks", 1, "e.g. `count: 2`"),
    "port": _port,
}
KEY_DOCS: dict[str, str] = {
    "pool": "The pool the run's hosts come from: a name ($TFCTL_HOME/pools/NAME.yaml) or a pool file's path.",
    "placement": "With `pool:`: `together` (each job on as few hosts as fit) or `ps_apart` (no ps beside a worker).",
    "jobs.<job>.count": "How many tasks the job has, placed from `pool:` or by a backend that places tasks itself.",
    "jobs.<job>.port": "The port the job's tasks listen on (another if a host gets two); unset: chosen at start.",
}


def check(doc: Doc, root: Mapping[str, Any]) -> None:
    """With `pool:`, every job asks (`count`) and none lists hosts; the hosts and how they are
    reached are the pool file's, so `hosts:` and `spares:` have no place beside it."""
    jobs = root.get("jobs")
    if "pool" not in root:
        if "placement" in root:
            doc.problem("placement", "places tasks on a pool's hosts, and there is no `pool:`", f"add `{EXAMPLE}`")
        return
    for key, why in (("hosts", "how each host is reached"), ("spares", "which hosts there are")):
        if key in root:
            doc.problem(key, f"the pool file says {why}", "move it to the pool file, or remove `pool:`")
    if not isinstance(jobs, dict):
        return
    for name, spec in jobs.items():
        if name not in JOB_NAMES:
            continue
        keys = spec if isinstance(spec, dict) else {"hosts": spec}
        if "hosts" in keys:
            listed = keys["hosts"]
            count = len(listed) if isinstance(listed, list) else 1
            where = f"jobs.{name}" if keys is not spec else f"jobs.{name}.hosts"
            fix = f"say how many: `{name}: {{count: {count}}}`"
            doc.problem(where, "lists hosts, but the pool places the tasks", fix)
        elif "count" not in keys:
            doc.problem(
                f"jobs.{name}", "has no `count`: with `pool:` a job says how many tasks", f"e.g. `{JOB_EXAMPLE}`"
            )
