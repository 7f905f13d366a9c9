"""What every Kubernetes export of a cluster file shares: names, the image, the container, and
the text Kubernetes must hand the shell unchanged.

`tfctl export tfjob`, `jobset` and `indexed-job` differ in who starts the pods and who tells a
pod which task it is; the container each task runs in (image, command, env, limits, working
directory) is the same in all three.
"""

from __future__ import annotations

import os
import re
import string
import tempfile
from pathlib import Path
from typing import Any, Sequence

import yaml

from tfctl.config.model import ClusterConfig, Job
from tfctl.errors import ConfigError, ConfigProblem, UsageError
from tfctl.tf.tasks import task_env
from tfctl.transport.base import shell_path

# The training operator requires this container name; the other exports keep it, so a pod's
# logs are `kubectl logs POD -c tensorflow` whichever launcher started it.
CONTAINER = "tensorflow"
# A task's port when its job has no one port of its own: each pod has its own address, so every
# task may listen on the same one (the training operator's default).
DEFAULT_PORT = 2222
# The end of every launcher: `command` with the pod's placeholders filled (each value
# shell-quoted, as tfctl fills them), run by `sh -c` as tfctl runs it.
RUN_FILLED = """\
command = command.format(**{k: shlex.quote(v) for k, v in values.items()})
os.execvp("sh", ["sh", "-c", command])
"""
# Pod and service names are RFC 1035 labels, at most 63 characters.
_NAME_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL_MAX = 63


def resource_name(config: ClusterConfig, kind: str, longest: str = "") -> str:
    """The cluster name as Kubernetes accepts it: lowercase, `-` for `_` and `.`.

    `longest` is the longest suffix the controller adds to make a pod's hostname, which must
    stay a label too.
    """
    name = config.name.lower().replace("_", "-").replace(".", "-")
    if _NAME_RE.fullmatch(name) and len(name + longest) <= _LABEL_MAX:
        return name
    if not _NAME_RE.fullmatch(name):
        why = "those names start with a letter and end with a letter or digit"
        suggestion = name.strip("-") if name[:1].isalpha() else "tf-" + name.strip("-")
    else:
        why = f"`{name}{longest}` is longer than {_LABEL_MAX} characters"
        suggestion = name[: _LABEL_MAX - len(longest)].rstrip("-")
    raise ConfigError(
        [
            ConfigProblem(
                config.path,
                None,
                None,
                "name",
                f"`{config.name}` cannot name a {kind} ({name}): Kubernetes names pods and services after it, "
                f"and {why}",
                f"rename the cluster, e.g. `name: {suggestion}`",
            )
        ]
    )


def image_for(config: ClusterConfig, job: str | None = None) -> str | None:
    """The pods' image: `kubernetes.image`, else the image the job's tasks (None: every task)
    run in under `up` (`container.image`), unless that is a rootfs folder no cluster can pull."""
    if config.kubernetes.image is not None:
        return config.kubernetes.image
    box = config.container_for(job) if job is not None else config.container
    return box.image if box is not None and not box.image.startswith("/") else None


def require_image(config: ClusterConfig, verb: str, jobs: Sequence[str | None]) -> None:
    """A ConfigError naming the key when a pod of one of `jobs` (None: of every job) has no image."""
    if all(image_for(config, job) is not None for job in jobs):
        return
    raise ConfigError(
        [
            ConfigProblem(
                config.path,
                None,
                None,
                "kubernetes.image",
                f"missing: `tfctl export {verb}` needs the container image the pods run",
                "add `kubernetes: {image: registry/team/train:1.0}` (or `container: {image: ...}`), "
                "an image with TensorFlow and your code",
            )
        ]
    )


def job_port(job: Job) -> int:
    """The port of the job's tasks in Kubernetes: the one its addresses share, else DEFAULT_PORT
    (a port chosen at `up` means nothing there)."""
    ports = {address.port or DEFAULT_PORT for address in job.addresses}
    return ports.pop() if len(ports) == 1 else DEFAULT_PORT


def run_values(config: ClusterConfig, name: str) -> dict[str, str]:
    """The placeholders every pod of the run shares, as the shell must read them: `{python}` is
    the image's `python`, `{run_id}` the resource's name."""
    return {"python": "python", "run_id": name, "logdir": shell_path(config.logdir_for(name) or "")}


def run_env(config: ClusterConfig, job: str, name: str) -> dict[str, str]:
    """The job's environment as `up` gives it, with the run's id and a run directory in the pod."""
    return {**task_env(config.env_for(job)), "TFCTL_RUN_ID": name, "TFCTL_RUN_DIR": f"/tmp/tfctl/{name}"}


def for_launcher(template: str, values: dict[str, str]) -> str:
    """`template` with `values` filled (as given: already shell-quoted) and every other
    placeholder kept for a launcher's str.format, the rest escaped so format keeps it."""
    out = []
    for literal, field, _spec, _conversion in string.Formatter().parse(template):
        out.append(_braces(literal))
        if field in values:
            out.append(_braces(values[field]))
        elif field is not None:
            out.append("{" + field + "}")
    return "".join(out)


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def literal(text: str) -> str:
    """Kubernetes expands `$(VAR)` and turns `$$` into `$` in a container's command and env; doubling
    those dollars makes it hand the shell exactly what tfctl would."""
    return re.sub(r"\$(?=[$(])", "$$", text)


def limits(job: Job) -> dict[str, int]:
    """The job's `gpus` and `cpus` (1 or more) as a container's resource limits."""
    return {key: count for key, count in (("nvidia.com/gpu", job.gpus), ("cpu", job.cpus)) if count}


def container(
    config: ClusterConfig, job: str | None, command: list[str], env: dict[str, str], most: dict[str, int]
) -> dict[str, Any]:
    """The task's container: the `kubernetes:` settings, the job's image (`image_for`), `command`
    and `env` as Kubernetes must pass them on, and `most` (GPUs, CPUs) as its limits."""
    settings = config.kubernetes
    box: dict[str, Any] = {"name": CONTAINER, "image": image_for(config, job)}
    if settings.image_pull_policy:
        box["imagePullPolicy"] = settings.image_pull_policy
    box["command"] = [literal(word) for word in command]
    if settings.workdir:
        box["workingDir"] = settings.workdir
    box["env"] = [{"name": key, "value": literal(value)} for key, value in env.items()]
    if most:
        box["resources"] = {"limits": most}
    return box


def pod_spec(config: ClusterConfig, box: dict[str, Any], restart_policy: str | None = None) -> dict[str, Any]:
    """A pod of one container, `box`; a TFJob sets the restart policy beside the pod, not in it."""
    pod: dict[str, Any] = {} if restart_policy is None else {"restartPolicy": restart_policy}
    if config.kubernetes.service_account:
        pod["serviceAccountName"] = config.kubernetes.service_account
    pod["containers"] = [box]
    return pod


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the launchers) as `|` blocks, readable in the manifest, and a value
    used twice written twice, not as a YAML alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_Dumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def to_yaml(config: ClusterConfig, what: str, verb: str, docs: list[dict[str, Any]]) -> str:
    header = f"# {what} from {config.path.name} (tfctl export {verb}): edit that file and export again\n"
    return header + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=1000)


def save(text: str, path: Path) -> None:
    """Write `path` whole or not at all: a half-written manifest must never reach `kubectl apply`."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror}", hint="choose another -o FILE") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as error:
        os.unlink(tmp)
        raise UsageError(f"cannot write {path}: {error.strerror}", hint="choose another -o FILE") from None
