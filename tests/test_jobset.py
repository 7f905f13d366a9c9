"""`tfctl export jobset` and `export indexed-job`: the manifests validate, and each pod builds the
TF_CONFIG and command that `up` would give its task.

No API server runs here, so the manifests are checked against the schemas one would use: the
JobSet CRD's OpenAPI schema (tests/data/jobset-crd.yaml, kubernetes-sigs/jobset at 08dfbdf) and
Kubernetes' own (the `kubernetes-validate` package, which ships them), both rejecting unknown
fields as `kubectl apply`'s strict field validation does. Each pod's command is run as the
kubelet would run it (its `$(VAR)` expansion, the downward API's job index or the Job's
JOB_COMPLETION_INDEX), with a stand-in `sh` that reports what it was handed; and the
parameter-server template runs for real, each task in a simulated host whose /etc/hosts knows
the pods' names.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import pytest
import yaml

from bench.netns_hosts import TestHostLab, require_netns
from tests.test_tfjob import kubernetes_expand, run_tfctl
from tfctl.config.loader import parse_config
from tfctl.config.model import Address, ClusterConfig
from tfctl.errors import ConfigError
from tfctl.kube.jobset import indexed_job_manifests, indexed_job_yaml, jobset_manifest, jobset_yaml
from tfctl.tf.tasks import DEFAULT_ENV, placeholder_values, render_command, tf_config

ROOT = Path(__file__).resolve().parent.parent
CRD = yaml.safe_load((ROOT / "tests" / "data" / "jobset-crd.yaml").read_text())
IMAGE = "registry.example/team/train:1.0"
CLUSTER_FILES = sorted(
    [*ROOT.glob("templates/*/cluster.yaml"), *ROOT.glob("examples/*/cluster*.yaml"), ROOT / "cluster.yaml.example"]
)
# The oldest Kubernetes with a Job success policy on by default (beta), and the newest schemas shipped.
K8S_VERSIONS = ("1.31", kubernetes_validate.utils.latest_version())
HAS_TF = importlib.util.find_spec("tensorflow") is not None and importlib.util.find_spec("sklearn") is not None


def strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused, as the API server's strict field validation
    refuses them (a structural schema allows no field it does not name), and int-or-string
    quantities typed as such."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items() if key != "properties"}
    if "properties" in schema:
        out["properties"] = {key: strict(value) for key, value in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    return out


JOBSET_SCHEMA = strict(CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
JOBSET_VALIDATOR = jsonschema.Draft7Validator(JOBSET_SCHEMA)


def jobset_errors(doc: dict[str, Any]) -> list[str]:
    """What the JobSet CRD's schema refuses in `doc` (its two CEL rules aside: tfctl writes
    neither a startupPolicy nor volume claims)."""
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in JOBSET_VALIDATOR.iter_errors(doc))


def core_errors(doc: dict[str, Any]) -> list[str]:
    """What Kubernetes' own schemas (strict: unknown fields refused) refuse in `doc`, per version."""
    errors = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{version}: {'.'.join(map(str, error.absolute_path))}: {error.message}")
    return errors


def as_job(jobset: dict[str, Any], replicated: dict[str, Any]) -> dict[str, Any]:
    """A replicated job's template as the Job the JobSet controller creates from it."""
    name = f"{jobset['metadata']['name']}-{replicated.get('name', 'unnamed')}-0"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": replicated["template"]["spec"]}


def all_errors(docs: list[dict[str, Any]]) -> list[str]:
    errors = []
    for doc in docs:
        if doc["kind"] == "JobSet":
            errors += jobset_errors(doc) + [
                e for r in doc["spec"].get("replicatedJobs", []) for e in core_errors(as_job(doc, r))
            ]
        else:
            errors += core_errors(doc)
    return errors


def with_image(path: Path) -> ClusterConfig:
    return parse_config(path.read_text() + f"\nkubernetes: {{image: {IMAGE}}}\n", path)


def small(jobs: str, top: str = "", kubernetes: str = "", command: str = "python train.py") -> ClusterConfig:
    text = f"name: demo\ncommand: '{command}'\n{top}jobs:\n{jobs}kubernetes: {{image: {IMAGE}{kubernetes}}}\n"
    return parse_config(text, Path("cluster.yaml"))


def box_of(pod_template: dict[str, Any]) -> dict[str, Any]:
    return pod_template["spec"]["containers"][0]


def replicated(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in doc["spec"]["replicatedJobs"]}


# -- the pods, as the controllers make them


Pod = tuple[str, dict[str, Any], dict[str, str]]  # hostname, container, the env the kubelet gives it


def jobset_pods(doc: dict[str, Any]) -> Iterator[tuple[str, Pod]]:
    """Every pod of the JobSet, with its replicated job's name; its env has the downward API's
    job index."""
    name, subdomain = doc["metadata"]["name"], doc["spec"]["network"]["subdomain"]
    for entry in doc["spec"]["replicatedJobs"]:
        box = box_of(entry["template"]["spec"]["template"])
        for index in range(entry["replicas"]):
            annotations = {"jobset.sigs.k8s.io/job-index": str(index)}
            yield entry["name"], (f"{name}-{entry['name']}-{index}-0.{subdomain}", box, kubelet_env(box, annotations))


def indexed_pods(job: dict[str, Any]) -> Iterator[Pod]:
    name, subdomain = job["metadata"]["name"], job["spec"]["template"]["spec"]["subdomain"]
    box = box_of(job["spec"]["template"])
    for index in range(job["spec"]["completions"]):
        env = {**kubelet_env(box, {}), "JOB_COMPLETION_INDEX": str(index)}
        yield f"{name}-{index}.{subdomain}", box, env


def kubelet_env(box: dict[str, Any], annotations: dict[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in box["env"]:
        if "valueFrom" in item:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            key = path.removeprefix("metadata.annotations['").removesuffix("']")
            env[item["name"]] = annotations[key]
        else:
            env[item["name"]] = kubernetes_expand(item["value"], env)
    return env


def run_pod(tmp_path: Path, box: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """What the container hands `sh -c`, and with which environment: a stand-in `sh` reports it."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "sh").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "print(json.dumps({'command': sys.argv[2], 'env': dict(os.environ)}))\n"
    )
    (fake / "sh").chmod(0o755)
    if not (fake / "python").exists():
        (fake / "python").symlink_to(sys.executable)  # the image's `python`
    words = [kubernetes_expand(word, env) for word in box["command"]]
    run_env = {**env, "PATH": f"{fake}:{os.environ['PATH']}"}
    result = subprocess.run(words, env=run_env, capture_output=True, text=True, timeout=30, check=True)
    return json.loads(result.stdout)


def pods_config(config: ClusterConfig, hostnames: list[str]) -> ClusterConfig:
    """`config` with its tasks, in task order, at `hostnames` on the port Kubernetes gives them:
    the one all of a job's addresses share, else 2222."""
    names = iter(hostnames)
    jobs = {}
    for job, spec in config.jobs.items():
        ports = {a.port or 2222 for a in spec.addresses}
        port = ports.pop() if len(ports) == 1 else 2222
        jobs[job] = replace(spec, addresses=tuple(Address(next(names), port) for _ in spec.addresses))
    return replace(config, jobs=MappingProxyType(jobs))


def check_pods(tmp_path: Path, config: ClusterConfig, pods: list[Pod]) -> None:
    """Each pod, in task order, builds its task's TF_CONFIG, command and env exactly as `up` does."""
    name = config.name.lower()
    named = pods_config(config, [hostname for hostname, _, _ in pods])
    tasks = named.tasks()
    assert len(tasks) == len(pods)
    for (job, index, _), (_, box, env) in zip(tasks, pods):
        ran = run_pod(tmp_path, box, env)
        assert ran["env"]["TF_CONFIG"] == tf_config(named, job, index)
        values = placeholder_values(named, job, index, "python", name)
        assert ran["command"] == render_command(config.command_for(job), values)
        expected_env = {
            **DEFAULT_ENV,
            **config.env_for(job),
            "TF_GRPC_DEFAULT_OPTIONS": "grpc.initial_reconnect_backoff_ms=100",
            "TFCTL_RUN_ID": name,
            "TFCTL_RUN_DIR": f"/tmp/tfctl/{name}",
        }
        assert {k: ran["env"].get(k) for k in expected_env} == expected_env


def jobset_in_task_order(config: ClusterConfig, doc: dict[str, Any]) -> list[Pod]:
    """The JobSet's pods in task order: the replicated jobs of a job (`worker0`, then `worker`)
    hold its tasks one after the other."""
    by_job: dict[str, list[Pod]] = {job: [] for job in config.jobs}
    for replicated_job, pod in jobset_pods(doc):
        by_job[replicated_job.rstrip("0")].append(pod)
    return [pod for job in config.jobs for pod in by_job[job]]


# -- every template and example


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_template_and_example_exports_a_valid_jobset_whose_pods_run_the_tasks(path: Path, tmp_path: Path):
    config = with_image(path)
    text = jobset_yaml(config)
    assert "&id0" not in text  # no YAML aliases: each value where it is used
    doc = yaml.safe_load(text)
    assert all_errors([doc]) == []
    assert (doc["apiVersion"], doc["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert doc["spec"]["network"]["enableDNSHostnames"] is True
    sizes = {r["name"]: r["replicas"] for r in doc["spec"]["replicatedJobs"]}
    assert sum(sizes.values()) == len(config.tasks())
    decider = "chief" if "chief" in config.jobs else "worker0" if len(config.jobs["worker"].addresses) > 1 else "worker"
    assert doc["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": [decider]}
    check_pods(tmp_path, config, jobset_in_task_order(config, doc))


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_template_and_example_exports_a_valid_indexed_job_whose_pods_run_the_tasks(path: Path, tmp_path: Path):
    config = with_image(path)
    text = indexed_job_yaml(config)
    assert "&id0" not in text  # the Service and the Job have equal metadata, each its own
    service, job = yaml.safe_load_all(text)
    assert all_errors([service, job]) == []
    assert (service["kind"], job["kind"], job["spec"]["completionMode"]) == ("Service", "Job", "Indexed")
    assert service["spec"]["clusterIP"] == "None"
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    tasks = config.tasks()
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == len(tasks)
    decider = [
        k
        for k, (name, index, _) in enumerate(tasks)
        if (name, index) == (("chief", 0) if "chief" in config.jobs else ("worker", 0))
    ]
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": str(decider[0])}]}
    check_pods(tmp_path, config, list(indexed_pods(job)))


def test_the_parameter_server_pods_get_these_tf_configs(tmp_path: Path):
    """The addresses spelled out once, as the JobSet controller names its pods."""
    doc = jobset_manifest(with_image(ROOT / "templates" / "parameter-server" / "cluster.yaml"))
    cluster = (
        '{"chief":["parameter-server-chief-0-0.parameter-server:2222"],'
        '"ps":["parameter-server-ps-0-0.parameter-server:2222"],'
        '"worker":["parameter-server-worker-0-0.parameter-server:2222",'
        '"parameter-server-worker-1-0.parameter-server:2222"]}'
    )
    seen = {}
    for _, (hostname, box, env) in jobset_pods(doc):
        seen[hostname.split(".")[0]] = run_pod(tmp_path, box, env)["env"]["TF_CONFIG"]
    assert seen == {
        "parameter-server-ps-0-0": '{"cluster":' + cluster + ',"task":{"type":"ps","index":0}}',
        "parameter-server-chief-0-0": '{"cluster":' + cluster + ',"task":{"type":"chief","index":0}}',
        "parameter-server-worker-0-0": '{"cluster":' + cluster + ',"task":{"type":"worker","index":0}}',
        "parameter-server-worker-1-0": '{"cluster":' + cluster + ',"task":{"type":"worker","index":1}}',
    }


# -- the checkers


def test_the_checkers_refuse_what_the_api_server_would():
    """A checker that passes everything proves nothing: each change breaks one rule."""
    good_jobset = jobset_manifest(with_image(ROOT / "templates" / "parameter-server" / "cluster.yaml"))
    good_job = indexed_job_manifests(with_image(ROOT / "templates" / "parameter-server" / "cluster.yaml"))
    assert all_errors([good_jobset, *good_job]) == []

    def broken(doc: dict[str, Any], change: Any) -> list[str]:
        doc = copy.deepcopy(doc)
        change(doc)
        return all_errors([doc])

    def pod_of(doc: dict[str, Any]) -> dict[str, Any]:
        return doc["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]

    spec = "spec"
    assert broken(good_jobset, lambda d: d[spec].update(replicatedJob=d[spec].pop("replicatedJobs"))) == [
        "spec: Additional properties are not allowed ('replicatedJob' was unexpected)"
    ]
    assert broken(good_jobset, lambda d: d[spec]["replicatedJobs"][0].pop("name")) == [
        "spec.replicatedJobs.0: 'name' is a required property"
    ]
    assert broken(good_jobset, lambda d: d[spec]["replicatedJobs"][0].update(replicas="1")) == [
        "spec.replicatedJobs.0.replicas: '1' is not of type 'integer'"
    ]
    assert broken(good_jobset, lambda d: d[spec]["successPolicy"].update(operator="Each")) == [
        "spec.successPolicy.operator: 'Each' is not one of ['All', 'Any']"
    ]
    typo = broken(good_jobset, lambda d: box_of(pod_of(d)).update(imagePullPolicyy="Always"))  # both schemas
    assert len(typo) == 1 + len(K8S_VERSIONS) and all("'imagePullPolicyy' was unexpected" in e for e in typo)
    service, job = good_job
    assert broken(job, lambda d: d[spec]["successPolicy"].update(rules="0")) == [
        f"{v}: spec.successPolicy.rules: '0' is not of type 'array'" for v in K8S_VERSIONS
    ]
    assert broken(service, lambda d: d[spec].update(headless=True)) == [
        f"{v}: spec: Additional properties are not allowed ('headless' was unexpected)" for v in K8S_VERSIONS
    ]
    assert broken(job, lambda d: box_of(d[spec]["template"]).update(command="python train.py")) == [
        f"{v}: spec.template.spec.containers.0.command: 'python train.py' is not of type 'array', 'null'"
        for v in K8S_VERSIONS
    ]
    assert broken(job, lambda d: box_of(d[spec]["template"]).pop("name")) == [
        f"{v}: spec.template.spec.containers.0: 'name' is a required property" for v in K8S_VERSIONS
    ]


# -- what the cluster file's keys become


def test_without_a_chief_worker_0_is_a_replicated_job_of_its_own_that_decides(tmp_path: Path):
    config = small("  ps: [a:2230]\n  worker: [a:2231, b:2231, c:2231]\n", command="run {job_name}:{task_index}")
    doc = jobset_manifest(config)
    assert all_errors([doc]) == []
    assert [(r["name"], r["replicas"]) for r in doc["spec"]["replicatedJobs"]] == [
        ("ps", 1),
        ("worker0", 1),
        ("worker", 2),
    ]
    assert doc["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["worker0"]}
    ran = [run_pod(tmp_path, box, env)["command"] for _, (_, box, env) in jobset_pods(doc)]
    assert ran == ["run ps:0", "run worker:0", "run worker:1", "run worker:2"]
    assert "dependsOn" not in str(doc) and "readinessProbe" not in str(doc)  # start_order: together

    one = jobset_manifest(small("  ps: [a:1]\n  worker: [a:2]\n"))
    assert [r["name"] for r in one["spec"]["replicatedJobs"]] == ["ps", "worker"]
    assert one["spec"]["successPolicy"]["targetReplicatedJobs"] == ["worker"]
    everyone = jobset_manifest(small("  chief: [a:1]\n  worker: [a:2, a:3]\n", top="success_policy: all_workers\n"))
    assert everyone["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief", "worker"]}
    _, job = indexed_job_manifests(small("  chief: [a:1]\n  worker: [a:2, a:3]\n", top="success_policy: all_workers\n"))
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0,1,2"}]}


def test_an_ordered_start_waits_for_the_ps_to_listen():
    doc = jobset_manifest(
        small("  ps: [a:2230]\n  worker: [a:2231, b:2231, c:2231]\n  evaluator: [e:1]\n", top="start_order: ordered\n")
    )
    assert all_errors([doc]) == []
    jobs = replicated(doc)
    assert list(jobs) == ["ps", "evaluator", "worker0", "worker"]
    assert [jobs[name].get("dependsOn") for name in jobs] == [
        None,
        None,
        [{"name": "ps", "status": "Ready"}],
        [{"name": "worker0", "status": "Ready"}],  # TF1 between-graph: worker 0 first, as `up` starts it
    ]
    probes = {name: box_of(r["template"]["spec"]["template"]).get("readinessProbe") for name, r in jobs.items()}
    assert probes == {
        "ps": {"tcpSocket": {"port": 2230}, "periodSeconds": 2},
        "evaluator": None,
        "worker0": {"tcpSocket": {"port": 2231}, "periodSeconds": 2},
        "worker": None,
    }
    everyone = small("  ps: [a:1]\n  worker: [a:2, b:2]\n", top="start_order: ordered\nsuccess_policy: all_workers\n")
    doc = jobset_manifest(everyone)
    assert [r.get("dependsOn", [{}])[0].get("name") for r in doc["spec"]["replicatedJobs"]] == [None, "ps", "worker0"]
    assert doc["spec"]["successPolicy"]["targetReplicatedJobs"] == ["worker0", "worker"]
    with_chief = replicated(
        jobset_manifest(small("  ps: [a:1]\n  chief: [c:1]\n  worker: [a:2, b:2]\n", top="start_order: ordered\n"))
    )
    assert [r.get("dependsOn") for r in with_chief.values()] == [None] + [[{"name": "ps", "status": "Ready"}]] * 2


def test_restart_policies_become_each_jobs_backoff_limit():
    config = small(
        "  ps: {hosts: ['a:2230'], restart: {policy: exit-code, max_restarts: 5}}\n"
        "  worker: {hosts: ['a:2231', 'b:2231'], gpus: 2, cpus: 8, restart: {policy: on-failure, max_restarts: 2}}\n"
        "  chief: {hosts: ['c:2222'], gpus: 0}\n"
    )
    doc = jobset_manifest(config)
    assert all_errors([doc]) == []
    jobs = {name: r["template"]["spec"] for name, r in replicated(doc).items()}
    assert {name: (j["backoffLimit"], j["template"]["spec"]["restartPolicy"]) for name, j in jobs.items()} == {
        "ps": (5, "Never"),  # replaced, so that the failure policy sees its exit code
        "chief": (0, "Never"),
        "worker": (2, "OnFailure"),
    }
    assert jobs["ps"]["podFailurePolicy"] == {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "tensorflow", "operator": "In", "values": list(range(1, 128))},
            }
        ]
    }
    assert "podFailurePolicy" not in jobs["worker"]
    assert box_of(jobs["worker"]["template"])["resources"] == {"limits": {"nvidia.com/gpu": 2, "cpu": 8}}
    assert "resources" not in box_of(jobs["chief"]["template"])

    _, job = indexed_job_manifests(config)  # one pod template: the most any job asks for
    assert all_errors([job]) == []
    assert (job["spec"]["backoffLimitPerIndex"], job["spec"]["maxFailedIndexes"]) == (5, 0)
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never" and "podFailurePolicy" not in job["spec"]
    assert box_of(job["spec"]["template"])["resources"] == {"limits": {"nvidia.com/gpu": 2, "cpu": 8}}
    _, only_exit_code = indexed_job_manifests(small("  worker: {hosts: [a, b], restart: {policy: exit-code}}\n"))
    assert only_exit_code["spec"]["podFailurePolicy"]["rules"][0]["action"] == "FailIndex"
    _, never = indexed_job_manifests(small("  worker: [a, b]\n"))
    assert (never["spec"]["backoffLimitPerIndex"], never["spec"]["template"]["spec"]["restartPolicy"]) == (0, "Never")


def test_a_slurm_file_exports_one_pod_per_counted_task(tmp_path: Path):
    config = small("  ps: {count: 1, port: 2230}\n  worker: {count: 3, port: 2230, gpus: 1}\n", top="backend: slurm\n")
    doc = jobset_manifest(config)
    service, job = indexed_job_manifests(config)
    assert all_errors([doc, service, job]) == []
    sizes = [(r["name"], r["replicas"]) for r in doc["spec"]["replicatedJobs"]]
    assert sizes == [("ps", 1), ("worker0", 1), ("worker", 2)] and job["spec"]["completions"] == 4
    tf = json.loads(run_pod(tmp_path, *next(indexed_pods(job))[1:])["env"]["TF_CONFIG"])
    assert tf["cluster"] == {"ps": ["demo-0.demo:2230"], "worker": [f"demo-{i}.demo:2230" for i in (1, 2, 3)]}


def test_kubernetes_settings_reach_the_pods():
    config = small(
        "  worker: [a:1, a:2]\n",
        kubernetes=", namespace: ml-team, image_pull_policy: Always, service_account: trainer, workdir: /app",
    )
    doc = jobset_manifest(config)
    service, job = indexed_job_manifests(config)
    assert all_errors([doc, service, job]) == []
    for metadata in (doc["metadata"], service["metadata"], job["metadata"]):
        assert metadata == {"name": "demo", "namespace": "ml-team"}
    for pod in (doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"], job["spec"]["template"]):
        assert pod["spec"]["serviceAccountName"] == "trainer"
        box = box_of(pod)
        assert (box["image"], box["imagePullPolicy"], box["workingDir"]) == (IMAGE, "Always", "/app")


def test_each_pod_gets_its_own_jobs_command_and_env(tmp_path: Path):
    config = small(
        "  ps: {hosts: [a], command: 'serve {task_index}', env: {ROLE: ps, SHARED: x}}\n"
        "  worker: {hosts: [a, b], env: {SHARED: x, COST: '$(HOME) $$'}}\n",
        command="train {job_name} {task_index} --ps={ps_hosts}",
    )
    _, job = indexed_job_manifests(config)
    box = box_of(job["spec"]["template"])
    shared = ["PYTHONUNBUFFERED", "SHARED", "TF_GRPC_DEFAULT_OPTIONS", "TFCTL_RUN_ID", "TFCTL_RUN_DIR"]
    assert [item["name"] for item in box["env"]] == shared  # the same for every job: the container's
    ran = [run_pod(tmp_path, box, env) for _, box, env in indexed_pods(job)]
    assert [r["command"] for r in ran] == [
        "serve 0",
        "train worker 0 --ps=demo-0.demo:2222",
        "train worker 1 --ps=demo-0.demo:2222",
    ]
    envs = [("ps", None)] + [(None, "$(HOME) $$")] * 2
    assert [(r["env"].get("ROLE"), r["env"].get("COST")) for r in ran] == envs
    in_jobset = [run_pod(tmp_path, box, env) for _, (_, box, env) in jobset_pods(jobset_manifest(config))]
    assert [r["command"] for r in in_jobset] == [
        "serve 0",
        "train worker 0 --ps=demo-ps-0-0.demo:2222",
        "train worker 1 --ps=demo-ps-0-0.demo:2222",
    ]
    assert [(r["env"].get("ROLE"), r["env"].get("COST")) for r in in_jobset] == envs


def test_no_image_or_an_unusable_name_is_a_config_error():
    config = parse_config("name: x\ncommand: y\njobs: {worker: [a:1]}\n", Path("c.yaml"))
    for export, verb in ((jobset_manifest, "jobset"), (indexed_job_manifests, "indexed-job")):
        with pytest.raises(ConfigError) as caught:
            export(config)
        assert caught.value.exit_code == 2
        assert (
            f"c.yaml: kubernetes.image: missing: `tfctl export {verb}` needs the container image"
            in caught.value.message
        )
    long = "a" * 52
    text = f"name: {long}\ncommand: y\njobs: {{worker: [a:1, a:2]}}\nkubernetes: {{image: i}}\n"
    with pytest.raises(ConfigError) as caught:
        jobset_manifest(parse_config(text, Path("c.yaml")))
    assert f"`{long}-worker0-0-0` is longer than 63 characters" in caught.value.message
    assert f"fix: rename the cluster, e.g. `name: {'a' * 51}`" in caught.value.message
    assert indexed_job_manifests(parse_config(text, Path("c.yaml")))[1]["metadata"]["name"] == long


@pytest.mark.parametrize("verb", ["jobset", "indexed-job"])
def test_cli_prints_or_writes_the_manifest(tmp_path: Path, verb: str):
    base = "name: x\ncommand: y\njobs: {worker: [a:1]}\n"
    (tmp_path / "cluster.yaml").write_text(base)
    refused = run_tfctl(tmp_path, "export", verb)
    assert (
        refused.returncode == 2 and "kubernetes.image: missing" in refused.stderr and "Traceback" not in refused.stderr
    )
    (tmp_path / "cluster.yaml").write_text(base + f"kubernetes: {{image: {IMAGE}}}\n")
    printed = run_tfctl(tmp_path, "export", verb)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith("# ") and f"(tfctl export {verb})" in printed.stdout.splitlines()[0]
    assert all_errors(list(yaml.safe_load_all(printed.stdout))) == []
    written = run_tfctl(tmp_path, "export", verb, "-o", "out.yaml")
    assert written.returncode == 0 and written.stdout == "" and "wrote out.yaml" in written.stderr
    assert (tmp_path / "out.yaml").read_text() == printed.stdout


# -- a real run


STEPS = 20


@pytest.mark.tf
@pytest.mark.netns
@pytest.mark.skipif(not HAS_TF, reason="TensorFlow (and scikit-learn) are not installed")
def test_the_parameter_server_template_trains_on_the_tf_configs_its_pods_build(tmp_path: Path):
    """Each pod in a host of its own, whose /etc/hosts knows the pods' names (`ip netns exec`
    bind-mounts /etc/netns/<netns>/hosts over it), runs its container's command as the kubelet
    would, with its job index: the chief trains with the ps and workers, and exits 0."""
    require_netns()
    template = ROOT / "templates" / "parameter-server"
    text = (template / "cluster.yaml").read_text().replace("--train_steps=400", f"--train_steps={STEPS}")
    assert f"--train_steps={STEPS}" in text
    # The pods run in the template's folder: its summaries go to the test's, not into the repository.
    text = text.replace("logdir: logs/{run_id}", f"logdir: {tmp_path}/logs/{{run_id}}")
    assert f"logdir: {tmp_path}/logs/" in text
    kubernetes = f"\nkubernetes: {{image: {IMAGE}, workdir: {template}}}\n"
    pods = [pod for _, pod in jobset_pods(jobset_manifest(parse_config(text + kubernetes, template / "cluster.yaml")))]
    lab = TestHostLab(len(pods), workdir=tmp_path / "lab", prefix="tfctl-k8", bridge="tfctlbr41", subnet="10.77.41")
    running: dict[str, subprocess.Popen[bytes]] = {}
    made: list[Path] = []
    netns_etc = Path("/etc/netns")
    had_netns_etc = netns_etc.is_dir()
    with lab:
        names = "".join(f"{h.address} {name} {name.split('.')[0]}\n" for h, (name, _, _) in zip(lab.hosts, pods))
        try:
            for host, (hostname, box, env) in zip(lab.hosts, pods):
                etc = netns_etc / host.netns
                etc.mkdir(parents=True, exist_ok=True)  # exists only if a killed run left it
                made.append(etc)
                (etc / "hosts").write_text("127.0.0.1 localhost\n" + names)
                pod = hostname.split(".")[0]
                words = [kubernetes_expand(word, env) for word in box["command"]]
                pod_env = {
                    **os.environ,
                    **env,
                    "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # the image's `python`
                    "TFCTL_RUN_DIR": str(tmp_path / pod),  # a pod's /tmp is its own; these share one
                }
                with open(tmp_path / f"{pod}.log", "wb") as log:
                    running[pod] = subprocess.Popen(
                        ["ip", "netns", "exec", host.netns, *words],
                        cwd=box["workingDir"],
                        env=pod_env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
            chief = "parameter-server-chief-0-0"
            code = running[chief].wait(timeout=150)
            logs = {pod: (tmp_path / f"{pod}.log").read_text(errors="replace") for pod in running}
            assert code == 0, "\n".join(f"== {pod}\n{text[-3000:]}" for pod, text in logs.items())
            assert f"final step {STEPS} " in logs[chief]
            assert "chief: coordinating 2 workers and 1 ps" in logs[chief]
            for hostname, _, _ in pods:  # each task serves at its pod's name, from the TF_CONFIG it built
                assert f"Started server with target: grpc://{hostname}:" in logs[hostname.split(".")[0]]
            for pod in ("parameter-server-ps-0-0", "parameter-server-worker-0-0", "parameter-server-worker-1-0"):
                assert running[pod].poll() is None  # servers: they end when the JobSet is done
            assert list((tmp_path / "logs" / "parameter-server" / "chief_0").glob("events.out.tfevents.*"))
            assert not (template / "logs").exists()
        finally:
            stop(running.values())
            for etc in made:
                (etc / "hosts").unlink(missing_ok=True)
                etc.rmdir()
            if not had_netns_etc:
                netns_etc.rmdir()


def stop(processes: Any) -> None:
    """SIGTERM, as Kubernetes ends the pods of a finished JobSet, then SIGKILL after a grace
    period; each process leads its own group (by its PID), with whatever it started."""
    alive = [p for p in processes if p.poll() is None]
    for process in alive:
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for process in alive:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
