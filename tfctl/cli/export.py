"""`tfctl export`: the cluster file as a job of another launcher (Kubeflow's TFJob, a JobSet, an
Indexed Job), to run the same tasks on Kubernetes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import click

from tfctl.cli.app import cli
from tfctl.cli.common import cluster_file_path, file_option, set_option

if TYPE_CHECKING:
    from tfctl.config.model import ClusterConfig


@cli.group(
    short_help="Write the cluster as a Kubernetes manifest.",
    epilog="""\b
Examples:
  tfctl export tfjob                 print ./cluster.yaml as a TFJob
  tfctl export jobset -o js.yaml     write it as a JobSet, for kubectl apply
  tfctl export indexed-job           as an Indexed Job and its Service""",
)
def export() -> None:
    """Describe the cluster file's tasks for another launcher, to run them there unchanged."""


def _output_option(function: Callable[..., int]) -> Callable[..., int]:
    return click.option(
        "-o",
        "--output",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Write the manifest to FILE (whole or not at all) instead of stdout.",
    )(function)


def _export(
    ctx: click.Context,
    cluster_file: Path | None,
    output: Path | None,
    assignments: tuple[str, ...],
    render: Callable[[ClusterConfig], str],
) -> int:
    from tfctl.config.loader import load_config
    from tfctl.config.params import overrides
    from tfctl.kube import pods

    text = render(load_config(cluster_file_path(ctx, cluster_file), overrides(assignments)))
    if output is None:
        sys.stdout.write(text)
    else:
        pods.save(text, output)
        click.echo(f"wrote {output}", err=True)
    return 0


@export.command(
    short_help="Print the cluster file as a Kubeflow TFJob (YAML).",
    epilog="""\b
Examples:
  tfctl export tfjob                         ./cluster.yaml, to stdout
  tfctl -f gpu.yaml export tfjob -o j.yaml   gpu.yaml, to j.yaml
  tfctl export tfjob | kubectl apply -f -    straight to Kubernetes""",
)
@file_option()
@_output_option
@set_option
@click.pass_context
def tfjob(ctx: click.Context, cluster_file: Path | None, output: Path | None, assignments: tuple[str, ...]) -> int:
    """A TFJob for Kubeflow's training operator: one replica spec per job, the same commands and env.

    Needs `kubernetes: {image: ...}` in the cluster file. Placeholders that differ per pod
    ({job_name}, {task_index}, the host lists) are filled in the pod from the operator's TF_CONFIG."""
    from tfctl.kube import tfjob as export_tfjob

    return _export(ctx, cluster_file, output, assignments, export_tfjob.to_yaml)


@export.command(
    short_help="Print the cluster file as a JobSet (YAML).",
    epilog="""\b
Examples:
  tfctl export jobset                         ./cluster.yaml, to stdout
  tfctl -f gpu.yaml export jobset -o js.yaml  gpu.yaml, to js.yaml
  tfctl export jobset | kubectl apply -f -    straight to Kubernetes""",
)
@file_option()
@_output_option
@set_option
@click.pass_context
def jobset(ctx: click.Context, cluster_file: Path | None, output: Path | None, assignments: tuple[str, ...]) -> int:
    """A JobSet (jobset.x-k8s.io/v1alpha2): one replicated job per job, one pod per task.

    Needs `kubernetes: {image: ...}` and the JobSet controller in the cluster. Each pod builds
    its TF_CONFIG from its job index, with the pods' DNS names; the run succeeds when the chief
    (else worker 0) does, and the ps are then stopped."""
    from tfctl.kube import jobset as export_jobset

    return _export(ctx, cluster_file, output, assignments, export_jobset.jobset_yaml)


@export.command(
    "indexed-job",
    short_help="Print the cluster file as an Indexed Job and a Service (YAML).",
    epilog="""\b
Examples:
  tfctl export indexed-job                       ./cluster.yaml, to stdout
  tfctl export indexed-job -o job.yaml           to job.yaml
  tfctl export indexed-job | kubectl apply -f -  straight to Kubernetes""",
)
@file_option()
@_output_option
@set_option
@click.pass_context
def indexed_job(
    ctx: click.Context, cluster_file: Path | None, output: Path | None, assignments: tuple[str, ...]
) -> int:
    """One Indexed Job whose completion indexes are the tasks, and its headless Service.

    For clusters without an operator (Kubernetes 1.31 or later, for the Job's success policy).
    Needs `kubernetes: {image: ...}`. Each pod builds its TF_CONFIG from JOB_COMPLETION_INDEX."""
    from tfctl.kube import jobset as export_jobset

    return _export(ctx, cluster_file, output, assignments, export_jobset.indexed_job_yaml)
