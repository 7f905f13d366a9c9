"""`tfctl pool`: a pool's hosts as they are now, asked of the hosts themselves: what each offers,
what every user's runs hold there, GPUs busy with processes no claim covers, hosts that did not
answer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfctl.cluster.pooling import HostLook, look
from tfctl.config.home import tfctl_home
from tfctl.config.loader import load_config
from tfctl.config.pool import Pool, load_pool, pool_path
from tfctl.errors import UsageError


@dataclass(frozen=True)
class PoolView:
    """One look at a pool: its file, and every host as it answered."""

    pool: Pool
    hosts: dict[str, HostLook]

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool.name,
            "file": str(self.pool.path),
            "hosts": [host_json(v) for v in self.hosts.values()],
        }


def host_json(look: HostLook) -> dict[str, Any]:
    host = look.host
    taken = look.taken()
    return {
        "host": host.name,
        "answered": look.error is None,
        "error": look.error,
        "gpus": {"offered": list(host.gpus), "free": [g for g in host.gpus if g not in taken.gpus]},
        "cpus": {"offered": host.cpus, "held": taken.cpus},
        "tasks": {"limit": host.tasks, "held": taken.tasks},
        "held": [h.to_wire() for h in look.held],
        "busy_elsewhere": {str(g): list(pids) for g, pids in sorted(look.foreign.items())},
        "gpu_error": look.gpu_error or None,
    }


def find(name: str | None, cluster_file: Path | None) -> Pool:
    """The pool `name` names (a name or a path); unnamed, the cluster file's `pool:`, else the
    only pool in $TFCTL_HOME/pools."""
    if name is not None:
        return load_pool(pool_path(name, Path.cwd()))
    if cluster_file is not None and cluster_file.exists():
        config = load_config(cluster_file)
        if config.pool is not None:
            return load_pool(pool_path(config.pool, config.path.parent))
    folder = tfctl_home() / "pools"
    found = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    if len(found) == 1:
        return load_pool(found[0])
    if not found:
        raise UsageError(
            f"no pool named, and none in {folder}",
            hint=f"write one there (e.g. {folder}/lab.yaml with `hosts: {{gpu1: {{gpus: 4}}}}`), or name a pool file",
        )
    names = ", ".join(p.name.rsplit(".", 1)[0] for p in found)
    raise UsageError(
        f"which pool? {folder} has {len(found)}: {names}", hint=f"name one: `tfctl pool {names.split(',')[0]}`"
    )


def pool_view(pool: Pool, accept_new_host_keys: bool = False) -> PoolView:
    return PoolView(pool, look(pool, accept_new_host_keys))
