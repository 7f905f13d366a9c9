"""`tfctl check` and `tfctl init`: everything before the first run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from tfctl.cli.app import cli
from tfctl.cli.common import (
    accept_new_option,
    cluster_file_path,
    file_option,
    named_file,
    run_store,
    set_option,
    stamp,
)
from tfctl.cli.complete import template_names
from tfctl.errors import UsageError


@cli.command(
    short_help="Check hosts, images, scripts and ports; start nothing.",
    epilog="""\b
Examples:
  tfctl check                          everything `up` checks before starting
  tfctl check --no-network             without the reachability probes
  tfctl check --accept-new-host-keys   pin SSH host keys seen the first time""",
)
@file_option()
@click.option(
    "--network/--no-network",
    default=True,
    help="Also check that every host reaches the ps ports (or, without ps, every worker port).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@set_option
@accept_new_option
@click.pass_context
def check(
    ctx: click.Context,
    cluster_file: Path | None,
    network: bool,
    as_json: bool,
    assignments: tuple[str, ...],
    accept_new_host_keys: bool,
) -> int:
    """Check every host as `up` would (SSH, versions, the tasks' images and scripts, free ports,
    network) and start nothing."""
    from rich.table import Table

    from tfctl import console
    from tfctl.backends.base import backend_for
    from tfctl.config.loader import load_config
    from tfctl.config.params import overrides
    from tfctl.controller.verbs import check, up

    config = load_config(cluster_file_path(ctx, cluster_file), overrides(assignments))
    refusal = backend_for(config.backend).check_refusal(config)
    if refusal is not None:
        raise refusal
    plan = up.plan_run(config, run_store())
    start = time.monotonic()
    report = check.check(
        plan,
        network,
        lambda who, msg: console.err().print(f"{stamp(start)} {who:<12} {msg}", markup=False),
        accept_new_host_keys,
    )
    if as_json:
        console.out().print_json(
            json.dumps(
                {
                    "hosts": [
                        {
                            "host": i.host,
                            "hostname": i.hostname,
                            "python": i.python,
                            "tensorflow": i.tensorflow,
                            "error": i.error,
                        }
                        for i in report.hosts
                    ],
                    "warnings": report.warnings,
                    "busy_ports": {address: info.to_wire() for address, info in report.busy.items()},
                    "network": report.network,
                }
            )
        )
    else:
        table = Table(box=None, pad_edge=False)
        for col in ("HOST", "HOSTNAME", "PYTHON", "TENSORFLOW"):
            table.add_column(col, no_wrap=True)
        for i in report.hosts:
            table.add_row(i.host, i.hostname, i.python or "-", i.tensorflow or "-")
        console.out().print(table)
        for warning in report.warnings:
            console.err().print(f"warning: {warning}", markup=False)
        for address, info in report.busy.items():
            console.err().print(
                f"port in use: {address} (pid {', '.join(map(str, info.pids)) or '?'} {info.command})", markup=False
            )
        if report.network:
            console.err().print(report.network, markup=False)
    return 1 if report.busy else 0


@cli.command(
    short_help="Write a cluster file and a training script from a template.",
    epilog="""\b
Examples:
  tfctl init                           a new ./between-graph-async
  tfctl init -t parameter-server psj   that template, in ./psj
  tfctl init --list                    the templates""",
)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), required=False)
@click.option(
    "-t",
    "--template",
    default=None,
    shell_complete=template_names,
    help="Template to use (default: between-graph-async).",
)
@click.option("--list", "list_only", is_flag=True, help="List the templates and exit.")
@click.option("--force", is_flag=True, help="Overwrite files that already exist.")
@click.pass_context
def init(ctx: click.Context, directory: Path | None, template: str | None, list_only: bool, force: bool) -> int:
    """Write a cluster file and a training script that run as generated on this machine.

    DIRECTORY (default: a new one named after the template) receives cluster.yaml, train.py and a
    README."""
    from tfctl import console
    from tfctl.tf import templates

    named = named_file(ctx, None)
    if named is not None:
        raise UsageError(
            f"`init` writes cluster.yaml into a directory; it takes no cluster file (-f {named})",
            hint=f"tfctl init {named.parent}" if named.parent != Path(".") else "tfctl init [DIRECTORY]",
        )

    if list_only:
        for name, title in templates.available().items():
            console.out().print(f"{name:<24} {title}", markup=False)
        return 0
    directory, written = templates.install(template or templates.DEFAULT_TEMPLATE, directory, force)
    for path in written:
        console.err().print(f"wrote {path}", markup=False)
    where = "" if directory == Path(".") else f"cd {directory} && "
    console.err().print(f"next: {where}tfctl up        (edit cluster.yaml to add your hosts)", markup=False)
    return 0
