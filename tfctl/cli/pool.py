"""`tfctl pool`: what a pool's hosts offer and what holds them now."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tfctl.cli.app import cli
from tfctl.cli.common import DEFAULT_FILE, accept_new_option, file_option, named_file

if TYPE_CHECKING:
    from tfctl.cluster.pooling import HostLook
    from tfctl.controller.verbs.pool import PoolView


@cli.command(
    name="pool",
    short_help="Show a pool's hosts: capacity, holders, busy GPUs.",
    epilog="""\b
Examples:
  tfctl pool                   the cluster file's pool (or the only pool)
  tfctl pool lab               $TFCTL_HOME/pools/lab.yaml
  tfctl pool ./shared.yaml     a pool file by its path
  tfctl pool lab --json        the same, as JSON""",
)
@click.argument("name", required=False)
@file_option()
@click.option("--json", "as_json", is_flag=True, help="Print the hosts and their holdings as JSON.")
@accept_new_option
@click.pass_context
def pool_command(
    ctx: click.Context, name: str | None, cluster_file: Path | None, as_json: bool, accept_new_host_keys: bool
) -> int:
    """Ask every host of pool NAME what it offers and what holds it: each user's runs' claims on
    its GPUs, cores and task slots, GPUs busy with processes tfctl did not place there, and hosts
    that do not answer. NAME is a pool in $TFCTL_HOME/pools, or a pool file's path."""
    from tfctl import console
    from tfctl.controller.verbs.pool import find, pool_view

    given = named_file(ctx, cluster_file) or (DEFAULT_FILE if DEFAULT_FILE.exists() else None)
    view = pool_view(find(name, given), accept_new_host_keys)
    if as_json:
        console.out().print_json(json.dumps(view.to_json()))
    else:
        render(view)
    return 0 if all(v.error is None for v in view.hosts.values()) else 1


def render(view: PoolView) -> None:
    """One line per host, then one per holder."""
    from rich.table import Table

    from tfctl import console

    table = Table(box=None, pad_edge=False, title_justify="left", title=f"pool {view.pool.name} ({view.pool.path})")
    for column in ("HOST", "GPUS FREE", "CORES HELD", "TASKS", "HELD BY"):
        table.add_column(column, overflow="fold")
    for look in view.hosts.values():
        table.add_row(*row(look))
    console.out().print(table)


def row(look: HostLook) -> tuple[str, str, str, str, str]:
    host = look.host
    if look.error is not None:
        return host.name, "-", "-", "-", f"did not answer: {look.error}"
    taken = look.taken()
    free = [g for g in host.gpus if g not in taken.gpus]
    gpus = f"{len(free)}/{len(host.gpus)}" + (f" ({','.join(map(str, free))})" if free else "") if host.gpus else "-"
    cores = f"{taken.cpus}/{host.cpus}" if host.cpus else "-"
    tasks = f"{taken.tasks}/{host.tasks}" if host.tasks else str(len({(h.run_id, h.task) for h in look.held}))
    holders: dict[tuple[str, str], list[str]] = {}
    for h in look.held:
        holders.setdefault((h.user or "?", h.run_id or "?"), []).append(h.resource)
    said = [f"{user} {run}: {', '.join(sorted(names))}" for (user, run), names in sorted(holders.items())]
    said += [
        f"GPU {g} busy (pids {', '.join(map(str, pids))}), not tfctl's" for g, pids in sorted(look.foreign.items())
    ]
    if look.gpu_error:
        said.append(f"GPUs unknown: {look.gpu_error}")
    return host.name, gpus, cores, tasks, "\n".join(said) or "nothing"
