"""`tfctl export tfjob`: the manifest validates against the TFJob CRD and runs what `up` runs.

The CRD (tests/data/tfjob-crd.yaml, trimmed from Kubeflow's training operator) is checked by a
small OpenAPI checker below, enough to catch a wrong key, type or missing field. Commands are
checked by running them as a pod would: Kubernetes' `$(VAR)` expansion, then LAUNCHER with the
operator's TF_CONFIG, and the command it hands to `sh` must be the one tfctl renders.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tfctl.config.loader import parse_config
from tfctl.config.model import ClusterConfig
from tfctl.errors import ConfigError
from tfctl.kube.tfjob import REPLICA_TYPES, manifest, to_yaml
from tfctl.tf.tasks import DEFAULT_ENV, render_command

ROOT = Path(__file__).resolve().parent.parent
CRD = yaml.safe_load((ROOT / "tests" / "data" / "tfjob-crd.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
IMAGE = "registry.example/team/train:1.0"
CLUSTER_FILES = sorted(
    [*ROOT.glob("templates/*/cluster.yaml"), *ROOT.glob("examples/*/cluster*.yaml"), ROOT / "cluster.yaml.example"]
)
TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "number": (int, float),
}


def schema_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """What the API server would refuse in `value`: types, required keys, unknown keys (kubectl's
    strict field validation), enums, int-or-string quantities."""
    if "anyOf" in schema:
        rest = {key: rule for key, rule in schema.items() if key != "anyOf"}
        if all(schema_errors({**rest, **choice}, value, path) for choice in schema["anyOf"]):
            return [f"{path}: {value!r} matches none of {schema['anyOf']}"]
        return []
    kind = schema.get("type")
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return [f"{path}: expected an integer, found {value!r}"]
    elif kind is not None and (not isinstance(value, TYPES[kind]) or (kind == "number" and isinstance(value, bool))):
        return [f"{path}: expected {kind}, found {type(value).__name__} {value!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} is not one of {schema['enum']}"]
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        return [f"{path}: {value!r} does not match {schema['pattern']}"]
    errors = []
    if isinstance(value, dict):
        properties, extra = schema.get("properties"), schema.get("additionalProperties")
        errors += [f"{path}: missing required `{key}`" for key in schema.get("required", ()) if key not in value]
        for key, item in value.items():
            if properties is not None and key in properties:
                errors += schema_errors(properties[key], item, f"{path}.{key}")
            elif isinstance(extra, dict):
                errors += schema_errors(extra, item, f"{path}.{key}")
            elif properties is not None or extra is False:
                errors.append(f"{path}: unknown field `{key}`")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += schema_errors(schema["items"], item, f"{path}[{index}]")
    return errors


def with_image(path: Path, extra: str = "") -> ClusterConfig:
    text = path.read_text() + f"\nkubernetes: {{image: {IMAGE}}}\n" + extra
    return parse_config(text, path)


def small(jobs: str, top: str = "", kubernetes: str = "", command: str = "python train.py") -> ClusterConfig:
    text = f"name: demo\ncommand: '{command}'\n{top}jobs:\n{jobs}kubernetes: {{image: {IMAGE}{kubernetes}}}\n"
    return parse_config(text, Path("cluster.yaml"))


def container(doc: dict[str, Any], replica: str) -> dict[str, Any]:
    return doc["spec"]["tfReplicaSpecs"][replica]["template"]["spec"]["containers"][0]


def kubernetes_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of a command word or env value: `$$` -> `$`, `$(VAR)` -> its value."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, text)


def pod_command(tmp_path: Path, words: list[str], env: dict[str, str]) -> str:
    """The shell command the container runs, with a fake `sh` on PATH that prints it."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "sh").write_text('#!/bin/sh\nprintf "%s" "$2"\n')
    (fake / "sh").chmod(0o755)
    if not (fake / "python").exists():
        (fake / "python").symlink_to(sys.executable)  # the image's `python`
    run_env = {**env, "PATH": f"{fake}:{os.environ['PATH']}"}
    result = subprocess.run(words, env=run_env, capture_output=True, text=True, timeout=30, check=True)
    return result.stdout


def operator_tf_config(doc: dict[str, Any], job: str, index: int) -> str:
    """TF_CONFIG as the training operator writes it: `<name>-<type>-<i>.<ns>.svc:<port>`, no evaluator."""
    name, namespace = doc["metadata"]["name"], doc["metadata"]["namespace"]
    cluster = {}
    for replica, spec in doc["spec"]["tfReplicaSpecs"].items():
        rtype = replica.lower()
        if rtype == "evaluator":
            continue
        ports = container(doc, replica).get("ports", [{"containerPort": 2222}])
        port = ports[0]["containerPort"]
        cluster[rtype] = [f"{name}-{rtype}-{i}.{namespace}.svc:{port}" for i in range(spec["replicas"])]
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}, "environment": "cloud"})


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_template_and_example_exports_a_valid_tfjob_that_runs_the_same_commands(
    path: Path, tmp_path: Path
) -> None:
    config = with_image(path)
    doc = yaml.safe_load(to_yaml(config))
    assert schema_errors(SCHEMA, doc) == []
    assert (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "TFJob")
    name = doc["metadata"]["name"]
    assert name == config.name.lower() and doc["metadata"]["namespace"] == "default"
    replicas = doc["spec"]["tfReplicaSpecs"]
    assert list(replicas) == [REPLICA_TYPES[job] for job in config.jobs]
    for job, spec in config.jobs.items():
        replica = replicas[REPLICA_TYPES[job]]
        assert replica["replicas"] == len(spec.addresses)
        assert replica["restartPolicy"] == "Never"
        box = container(doc, REPLICA_TYPES[job])
        assert (box["name"], box["image"]) == ("tensorflow", IMAGE)
        env = {item["name"]: kubernetes_expand(item["value"], {}) for item in box["env"]}
        assert env == {
            **DEFAULT_ENV,
            **config.env_for(job),
            "TF_GRPC_DEFAULT_OPTIONS": "grpc.initial_reconnect_backoff_ms=100",
            "TFCTL_RUN_ID": name,
            "TFCTL_RUN_DIR": f"/tmp/tfctl/{name}",
        }
        assert "resources" not in box
        ports = {a.port or 2222 for a in spec.addresses}  # a port chosen at start: the operator's 2222
        own_port = len(ports) == 1 and ports != {2222}
        assert box.get("ports") == ([{"name": "tfjob-port", "containerPort": min(ports)}] if own_port else None)
        hosts = json.loads(operator_tf_config(doc, job, 0))["cluster"]
        for index in range(len(spec.addresses)):
            tf_config = operator_tf_config(doc, job, index)
            words = [kubernetes_expand(word, env) for word in box["command"]]
            ran = pod_command(tmp_path, words, {**env, "TF_CONFIG": tf_config})
            values = {
                "job_name": job,
                "task_index": str(index),
                **{f"{j}_hosts": ",".join(hosts.get(j, [])) for j in ("ps", "worker", "chief", "evaluator")},
                "python": "python",
                "run_id": name,
                "logdir": config.logdir_for(name) or "",
            }
            assert ran == render_command(config.command_for(job), values)


def test_the_checker_refuses_what_the_api_server_would() -> None:
    """A checker that passes everything proves nothing: each of these breaks one rule."""
    good = manifest(with_image(ROOT / "templates" / "parameter-server" / "cluster.yaml"))
    assert schema_errors(SCHEMA, good) == []

    def broken(change: Any) -> list[str]:
        doc = copy.deepcopy(good)
        change(doc)
        return schema_errors(SCHEMA, doc)

    worker = good["spec"]["tfReplicaSpecs"]["Worker"]
    assert broken(lambda d: d["spec"].update(tfReplicaSpec=d["spec"].pop("tfReplicaSpecs"))) == [
        ".spec: missing required `tfReplicaSpecs`",
        ".spec: unknown field `tfReplicaSpec`",
    ]
    assert broken(lambda d: d["spec"]["tfReplicaSpecs"]["Worker"].update(replicas="2")) == [
        ".spec.tfReplicaSpecs.Worker.replicas: expected an integer, found '2'"
    ]
    assert broken(lambda d: container(d, "Worker").update(imagePullPolicyy="Always")) == [
        ".spec.tfReplicaSpecs.Worker.template.spec.containers[0]: unknown field `imagePullPolicyy`"
    ]
    assert broken(lambda d: container(d, "PS").pop("name")) == [
        ".spec.tfReplicaSpecs.PS.template.spec.containers[0]: missing required `name`"
    ]
    assert broken(lambda d: container(d, "PS").update(command="python train.py")) == [
        ".spec.tfReplicaSpecs.PS.template.spec.containers[0].command: expected array, found str 'python train.py'"
    ]
    env_after = len(container(good, "PS")["env"])
    assert broken(lambda d: container(d, "PS")["env"].append({"value": "1"})) == [
        f".spec.tfReplicaSpecs.PS.template.spec.containers[0].env[{env_after}]: missing required `name`"
    ]
    assert broken(lambda d: container(d, "PS").update(resources={"limits": {"cpu": "two"}})) != []
    assert broken(lambda d: container(d, "PS").update(resources={"limits": {"cpu": 2, "nvidia.com/gpu": "1"}})) == []
    assert worker["template"]["spec"]["containers"][0]["name"] == "tensorflow"
    assert schema_errors({"type": "string", "enum": ["Never", "OnFailure"]}, "Sometimes") == [
        ": 'Sometimes' is not one of ['Never', 'OnFailure']"
    ]


def test_resources_ports_and_restart_policies_follow_the_jobs() -> None:
    config = small(
        "  ps: {hosts: ['a:2230'], restart: {policy: exit-code, max_restarts: 5}}\n"
        "  worker: {hosts: ['a:2231', 'b:2231'], gpus: 2, cpus: 8, restart: {policy: on-failure}}\n"
        "  chief: {hosts: ['c:2222'], gpus: 0}\n"
        "  evaluator: ['a:2232']\n",
        top="success_policy: all_workers\n",
    )
    doc = manifest(config)
    assert schema_errors(SCHEMA, doc) == []
    replicas = doc["spec"]["tfReplicaSpecs"]
    assert list(replicas) == ["Chief", "PS", "Worker", "Evaluator"]
    assert [replicas[r]["restartPolicy"] for r in replicas] == ["Never", "ExitCode", "OnFailure", "Never"]
    assert doc["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 5}
    assert doc["spec"]["successPolicy"] == "AllWorkers"
    assert container(doc, "Worker")["resources"] == {"limits": {"nvidia.com/gpu": 2, "cpu": 8}}
    assert "resources" not in container(doc, "Chief")  # 0 GPUs: none asked for
    assert container(doc, "PS")["ports"] == [{"name": "tfjob-port", "containerPort": 2230}]
    assert container(doc, "Worker")["ports"] == [{"name": "tfjob-port", "containerPort": 2231}]
    assert "ports" not in container(doc, "Chief")  # the operator's default, 2222


def test_a_slurm_file_exports_one_pod_per_counted_task() -> None:
    config = small("  ps: {count: 1, port: 2230}\n  worker: {count: 3, port: 2230, gpus: 1}\n", top="backend: slurm\n")
    doc = manifest(config)
    assert schema_errors(SCHEMA, doc) == []
    replicas = doc["spec"]["tfReplicaSpecs"]
    assert (replicas["PS"]["replicas"], replicas["Worker"]["replicas"]) == (1, 3)
    assert container(doc, "Worker")["ports"] == [{"name": "tfjob-port", "containerPort": 2230}]
    assert container(doc, "Worker")["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_hosts_without_ports_export_with_the_operators_own_port() -> None:
    """A port chosen at `up` means nothing to a TFJob: its pods get the operator's 2222."""
    doc = manifest(small("  worker: [gpu1, gpu1, gpu2]\n", top="", command="python train.py"))
    assert schema_errors(SCHEMA, doc) == []
    assert doc["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 3
    assert "ports" not in container(doc, "Worker")
    single = manifest(small("  worker: [gpu1]\n", command="python train.py --worker_hosts={worker_hosts}"))
    assert "localhost:2222" in " ".join(container(single, "Worker")["command"])


def test_mixed_ports_keep_the_operator_default() -> None:
    doc = manifest(small("  ps: [a:2222]\n  worker: [a:2223, a:2224]\n"))
    assert "ports" not in container(doc, "Worker") and "successPolicy" not in doc["spec"]
    assert doc["spec"]["runPolicy"] == {"cleanPodPolicy": "Running"}


def test_kubernetes_settings_reach_the_pods() -> None:
    config = small(
        "  worker: [a:1, a:2]\n",
        kubernetes=", namespace: ml-team, image_pull_policy: Always, service_account: trainer, workdir: /app",
    )
    doc = manifest(config)
    assert schema_errors(SCHEMA, doc) == []
    assert doc["metadata"] == {"name": "demo", "namespace": "ml-team"}
    pod = doc["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer"
    assert (pod["containers"][0]["imagePullPolicy"], pod["containers"][0]["workingDir"]) == ("Always", "/app")
    assert pod["containers"][0]["command"] == ["sh", "-c", "python train.py"]  # nothing per pod: no launcher


def test_a_single_task_gets_its_values_here(tmp_path: Path) -> None:
    """The operator sets no TF_CONFIG for a one-pod job, so nothing can be filled in the pod."""
    config = parse_config(
        f"name: solo\ncommand: '{{python}} t.py --job_name={{job_name}} --task_index={{task_index}} "
        f"--worker_hosts={{worker_hosts}} --ps_hosts={{ps_hosts}} --run={{run_id}}'\n"
        f"jobs: {{worker: ['gpu1:2300']}}\nkubernetes: {{image: {IMAGE}}}\n",
        Path("cluster.yaml"),
    )
    box = container(manifest(config), "Worker")
    assert box["command"] == [
        "sh",
        "-c",
        "python t.py --job_name=worker --task_index=0 --worker_hosts=localhost:2300 --ps_hosts='' --run=solo",
    ]
    assert box["ports"] == [{"name": "tfjob-port", "containerPort": 2300}]


def test_dollars_and_braces_reach_the_shell_as_written(tmp_path: Path) -> None:
    """Kubernetes would expand `$(TFCTL_RUN_DIR)` and halve `$$`; tfctl's shell would not."""
    command = "echo $$ $(TFCTL_RUN_DIR) ${{HOME}} {logdir} {job_name}:{task_index}"
    doc = manifest(small("  worker: [a:1, a:2]\n", top="logdir: 'logs/{run_id} x'\n", command=command))
    box = container(doc, "Worker")
    env = {item["name"]: kubernetes_expand(item["value"], {}) for item in box["env"]}
    words = [kubernetes_expand(word, env) for word in box["command"]]
    ran = pod_command(tmp_path, words, {**env, "TF_CONFIG": operator_tf_config(doc, "worker", 1)})
    assert ran == "echo $$ $(TFCTL_RUN_DIR) ${HOME} 'logs/demo x' worker:1"


def test_names_become_kubernetes_names_or_say_why_not() -> None:
    text = f"name: NAME\ncommand: x\njobs: {{worker: [a:1]}}\nkubernetes: {{image: {IMAGE}}}\n"
    doc = manifest(parse_config(text.replace("NAME", "My_Net.v2"), Path("cluster.yaml")))
    assert doc["metadata"]["name"] == "my-net-v2"
    with pytest.raises(ConfigError) as caught:
        manifest(parse_config(text.replace("NAME", "2layers"), Path("cluster.yaml")))
    assert "cluster.yaml: name: `2layers` cannot name a TFJob" in caught.value.message
    assert "fix: rename the cluster, e.g. `name: tf-2layers`" in caught.value.message


def test_up_needs_no_image_but_export_does() -> None:
    config = parse_config("name: x\ncommand: y\njobs: {worker: [a:1]}\n", Path("c.yaml"))
    assert config.kubernetes.image is None and config.kubernetes.namespace == "default"
    with pytest.raises(ConfigError) as caught:
        manifest(config)
    assert caught.value.exit_code == 2
    assert caught.value.message.splitlines()[1:] == [
        "c.yaml: kubernetes.image: missing: `tfctl export tfjob` needs the container image the pods run",
        "  fix: add `kubernetes: {image: registry/team/train:1.0}` (or `container: {image: ...}`), "
        "an image with TensorFlow and your code",
    ]


def test_export_takes_the_image_up_runs_the_tasks_in_unless_kubernetes_names_one() -> None:
    text = (
        "name: x\ncommand: y\ncontainer: {image: team/train:2}\n"
        "jobs: {ps: [a:1], worker: {hosts: [b:1], container: {image: team/worker:3}}}\n"
    )
    images = {
        kind: spec["template"]["spec"]["containers"][0]["image"]
        for kind, spec in manifest(parse_config(text, Path("c.yaml")))["spec"]["tfReplicaSpecs"].items()
    }
    assert images == {"PS": "team/train:2", "Worker": "team/worker:3"}
    named = manifest(parse_config(text + "kubernetes: {image: k8s/train:1}\n", Path("c.yaml")))
    assert {s["template"]["spec"]["containers"][0]["image"] for s in named["spec"]["tfReplicaSpecs"].values()} == {
        "k8s/train:1"
    }
    with pytest.raises(ConfigError, match="kubernetes.image: missing"):  # a rootfs folder is no image to pull
        manifest(parse_config(text.replace("team/train:2", "/srv/rootfs"), Path("c.yaml")))


BASE = "name: x\ncommand: y\njobs: {worker: [a:1]}\n"
ERRORS = {
    "unknown key": (
        "kubernetes: {image: i, namespase: a}\n",
        "c.yaml:4:24: kubernetes.namespase: unknown key `namespase`\n  fix: did you mean `namespace`?",
    ),
    "not a mapping": ("kubernetes: tensorflow:2.16\n", "c.yaml:4:13: kubernetes: expected a mapping, found a string"),
    "image a number": ("kubernetes: {image: 2}\n", "c.yaml:4:21: kubernetes.image: expected a string, found a number"),
    "image with spaces": ("kubernetes: {image: a b}\n", "kubernetes.image: `a b` is not an image reference"),
    "pull policy case": (
        "kubernetes: {image_pull_policy: always}\n",
        "kubernetes.image_pull_policy: expected one of Always, IfNotPresent, Never, found a string (`always`)\n"
        "  fix: did you mean `Always`?",
    ),
    "namespace upper case": (
        "kubernetes: {namespace: ML}\n",
        "kubernetes.namespace: `ML` is not a valid Kubernetes namespace\n  fix: use at most 63 lowercase letters",
    ),
    "service account": ("kubernetes: {service_account: a_b}\n", "`a_b` is not a valid Kubernetes service account"),
    "relative workdir": (
        "kubernetes: {workdir: app}\n",
        "kubernetes.workdir: `app` is relative; a container's working directory is absolute\n"
        "  fix: e.g. `workdir: /app`",
    ),
}


@pytest.mark.parametrize("text, expected", ERRORS.values(), ids=ERRORS.keys())
def test_kubernetes_section_errors_name_place_and_fix(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(BASE + text, Path("c.yaml"))
    assert expected in caught.value.message


def run_tfctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tfctl", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TFCTL_HOME": str(tmp_path / "home"), "NO_COLOR": "1"},
    )


def test_cli_prints_or_writes_the_manifest_and_refuses_a_file_without_image(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(BASE)
    result = run_tfctl(tmp_path, "export", "tfjob")
    assert result.returncode == 2 and result.stdout == ""
    assert "cluster.yaml: kubernetes.image: missing" in result.stderr and "fix: add `kubernetes:" in result.stderr
    assert "Traceback" not in result.stderr

    (tmp_path / "cluster.yaml").write_text(BASE + f"kubernetes: {{image: {IMAGE}}}\n")
    printed = run_tfctl(tmp_path, "export", "tfjob")
    assert printed.returncode == 0, printed.stderr
    assert schema_errors(SCHEMA, yaml.safe_load(printed.stdout)) == []

    written = run_tfctl(tmp_path, "-f", "cluster.yaml", "export", "tfjob", "-o", "job.yaml")
    assert written.returncode == 0 and written.stdout == ""
    assert (tmp_path / "job.yaml").read_text() == printed.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml", "job.yaml"]  # no temporary left

    nowhere = run_tfctl(tmp_path, "export", "tfjob", "-o", "missing/job.yaml")
    assert nowhere.returncode == 2 and "cannot write missing/job.yaml" in nowhere.stderr
