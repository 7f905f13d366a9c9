"""Preflight: what `up` learns of every host and refuses before it puts anything on one, and
what `check` says without starting anything. Both go through `preflight`, so `check` passes
only what `up` would start: the hosts and their Pythons, the tasks' images (pulled or loaded
if need be), the scripts the commands name, and the modules those import.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Collection, Iterator

from tfctl.cluster.answers import HostInfo
from tfctl.cluster.cluster import Cluster, Progress, quiet
from tfctl.config.model import ClusterConfig
from tfctl.controller.start import scripts
from tfctl.controller.start.plan import local_workdir
from tfctl.errors import StartupError
from tfctl.tf.tasks import chief_task, containers_by_host

TENSORBOARD = "tensorboard"  # the module `tfctl tensorboard` runs on the chief's host

CONTAINERS_GUIDE = "docs/guide/containers.md"
PREPARING_EVERY = 10.0  # seconds between lines while preflight pulls or loads images
PULLED_LINE_EVERY = 2.0  # seconds between two of a host's pull lines shown (the latest is shown)


@contextlib.contextmanager
def still_preparing(progress: Progress, hosts: list[str]) -> Iterator[Progress]:
    """While preflight waits, where images may be pulled or loaded from their tarballs first (a
    multi-GB pull takes minutes, and must not look hung): yields who hears each host's pull
    lines, shown as they come, a host's latest every PULLED_LINE_EVERY seconds at most; and a
    line every PREPARING_EVERY seconds says how long it has been."""
    if not hosts:
        yield quiet
        return
    done = threading.Event()
    lock = threading.Lock()
    began = time.monotonic()
    unshown: dict[str, str] = {}  # host -> its latest pull line, not shown yet
    shown_at: dict[str, float] = {}

    def show(host: str) -> None:
        with lock:
            line = unshown.pop(host, None)
            shown_at[host] = time.monotonic()
        if line is not None:
            progress(host, f"image: {line}")

    def heard(host: str, line: str) -> None:
        with lock:
            unshown[host] = line
            due = time.monotonic() - shown_at.get(host, -PULLED_LINE_EVERY) >= PULLED_LINE_EVERY
        if due:
            show(host)

    def tick() -> None:
        while not done.wait(PREPARING_EVERY):
            seconds = time.monotonic() - began
            where = ", ".join(hosts)
            progress(
                "", f"preparing the tasks' images on {where} ({seconds:.0f}s; pulls end at container.pull_timeout)"
            )
            with lock:
                waiting = sorted(unshown)
            for host in waiting:
                show(host)

    ticker = threading.Thread(target=tick, name="preparing-images", daemon=True)
    ticker.start()
    try:
        yield heard
    finally:
        done.set()
        ticker.join()


def preflight(cluster: Cluster, config: ClusterConfig, progress: Progress, gpus: Collection[str]) -> list[HostInfo]:
    """Every host's answers (`Cluster.preflight`), its GPUs where `gpus` ask; raises what `up`
    would fail on soon after the start: a script the commands name that is not in the workdir,
    an image that cannot be had or run, a module a script imports that its Python lacks."""
    workdir = Path(local_workdir(config))
    found = scripts.scripts(config, workdir) if _workdir_is_theirs(config, cluster) else []
    missing = scripts.missing_scripts(config, found, workdir)
    if missing is not None:
        raise missing
    imports = {} if config.setup else scripts.imported_modules(found, workdir)  # setup may install them
    needs = _modules_by_host(config, imports)
    asked = {host: list(modules) for host, modules in needs.items()}
    viewer = tensorboard_host(config)
    if viewer is not None and TENSORBOARD not in asked.setdefault(viewer, []):
        asked[viewer].append(TENSORBOARD)  # for `tfctl tensorboard`: said, not refused, when missing
    boxes = containers_by_host(config)
    with still_preparing(progress, sorted(boxes)) as heard:
        infos = cluster.preflight(progress, gpus, boxes, heard, asked)
    needed = [
        replace(i, missing_modules=tuple(m for m in i.missing_modules if m in needs.get(i.host, ()))) for i in infos
    ]
    refusal = lacking_modules(config, needed, {s.job: s.named for s in found})
    if refusal is not None:
        raise refusal
    return infos


def tensorboard_host(config: ClusterConfig) -> str | None:
    """Where `tfctl tensorboard` shows the run's summaries (the chief's host), if it writes any."""
    if config.logdir is None:
        return None
    chief = chief_task(config)
    return next((a.host for job, index, a in config.tasks() if f"{job}:{index}" == chief), None)


def tensorboard_warnings(config: ClusterConfig, infos: list[HostInfo]) -> list[str]:
    """A `logdir` whose summaries no TensorBoard could show: TensorFlow 2.21 no longer brings it."""
    viewer = tensorboard_host(config)
    return [
        f"{i.host}: {i.python_executable or 'its python'} has no tensorboard, so `tfctl tensorboard` cannot show "
        f"the summaries in `logdir` (install it there: {i.python_executable or 'python'} -m pip install tensorboard)"
        for i in infos
        if i.host == viewer and TENSORBOARD in i.missing_modules
    ]


def _workdir_is_theirs(config: ClusterConfig, cluster: Cluster) -> bool:
    """Whether the tasks run this machine's workdir (synced, or on hosts that see its files): only
    then is a script missing here missing there."""
    return config.sync or all(h.shares_files for h in cluster.record.hosts)


def _modules_by_host(config: ClusterConfig, imports: dict[str, list[str]]) -> dict[str, list[str]]:
    """host -> what its tasks' scripts import; a job whose env sets PYTHONPATH finds modules
    where preflight does not look, and is left out."""
    needs: dict[str, list[str]] = {}
    for job, _, address in config.tasks():
        if "PYTHONPATH" in config.env_for(job):
            continue
        have = needs.setdefault(address.host, [])
        have += [m for m in imports.get(job, []) if m not in have]
    return {host: modules for host, modules in needs.items() if modules}


def lacking_modules(config: ClusterConfig, infos: list[HostInfo], script_of: dict[str, str]) -> StartupError | None:
    """The refusal when a host's Python (or its tasks' image) lacks modules the scripts import:
    every task there would end in `ModuleNotFoundError` seconds after the start."""
    lacking = [i for i in infos if i.missing_modules]
    if not lacking:
        return None
    lines = []
    for info in lacking:
        jobs = {job for job, _, address in config.tasks() if address.host == info.host}
        named = ", ".join(sorted({script_of[j] for j in jobs if j in script_of}))
        them = "it" if len(info.missing_modules) == 1 else "them"
        python = info.python_executable or "its python"
        where = f"{info.container} ({python})" if info.container else python
        lines.append(f"  {info.host}: {', '.join(info.missing_modules)} ({named} imports {them}), in {where}")
    if any(i.container for i in lacking):
        hint = f"install them in the image, or name an image that has them ({CONTAINERS_GUIDE}: building an image)"
    else:
        hint = "install the packages that provide them into that Python, or point `python` at one that has them"
    return StartupError("the tasks' Python lacks modules their script imports:\n" + "\n".join(lines), hint=hint)
