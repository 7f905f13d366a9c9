"""`tfctl export tfjob`: the cluster file as a job of another launcher (Kubeflow's TFJob)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tfctl.cli.app import cli
from tfctl.cli.common import cluster_file_path, file_option


@cli.group(
    short_help="Write the cluster as a Kubeflow TFJob manifest.",
    epilog="""\b
Examples:
  tfctl export tfjob                 print ./cluster.yaml as a TFJob
  tfctl export tfjob -o tfjob.yaml   write it to a file, for kubectl apply""",
)
def export() -> None:
    """Describe the cluster file's tasks for another launcher, to run them there unchanged."""


@export.command(
    short_help="Print the cluster file as a Kubeflow TFJob (YAML).",
    epilog="""\b
Examples:
  tfctl export tfjob                         ./cluster.yaml, to stdout
  tfctl -f gpu.yaml export tfjob -o j.yaml   gpu.yaml, to j.yaml
  tfctl export tfjob | kubectl apply -f -    straight to Kubernetes""",
)
@file_option()
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the manifest to FILE (whole or not at all) instead of stdout.",
)
@click.pass_context
def tfjob(ctx: click.Context, cluster_file: Path | None, output: Path | None) -> int:
    """A TFJob for Kubeflow's training operator: one replica spec per job, the same commands and env.

    Needs `kubernetes: {image: ...}` in the cluster file. Placeholders that differ per pod
    ({job_name}, {task_index}, the host lists) are filled in the pod from the operator's TF_CONFIG."""
    from tfctl.config.loader import load_config
    from tfctl.tf import tfjob as export_tfjob

    text = export_tfjob.to_yaml(load_config(cluster_file_path(ctx, cluster_file)))
    if output is None:
        sys.stdout.write(text)
    else:
        export_tfjob.save(text, output)
        click.echo(f"wrote {output}", err=True)
    return 0
