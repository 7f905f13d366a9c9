"""A host's devices for placement: the GPUs nvidia-smi lists and the cores tasks may run on.

The controller places tasks on these (`tfctl.config.devices`); a task's monitor then pins it to its cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Dict, List, Optional, Sequence, Tuple

from .protocol import Gpu

NVIDIA_SMI = ("nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader")
COMPUTE_APPS = ("--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader")
NVIDIA_SMI_TIMEOUT = 30.0


def cpu_cores() -> List[int]:
    """The cores this process may run on (a cgroup cpuset or taskset may allow fewer than the
    machine has); tasks started from here inherit them."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def gpus() -> Tuple[List[Gpu], Optional[str]]:
    """The GPUs nvidia-smi lists, or none and why: a host without nvidia-smi (or whose driver does
    not answer) has no GPU a task could use."""
    output, error = _nvidia_smi(NVIDIA_SMI[1:])
    if error is not None:
        return [], error
    try:
        return parse_gpus(output.splitlines()), None
    except ValueError as e:
        return [], "nvidia-smi printed an unexpected line: %s" % e


def gpu_processes() -> Tuple[Dict[int, List[int]], Optional[str]]:
    """GPU index -> the processes computing on it, as nvidia-smi lists them (a pool's view of a
    GPU busy with work tfctl did not place there); no nvidia-smi: none, and no error."""
    if shutil.which(NVIDIA_SMI[0]) is None:
        return {}, None
    found, error = gpus()
    if error is not None:
        return {}, error
    output, error = _nvidia_smi(COMPUTE_APPS)
    if error is not None:
        return {}, error
    index = {gpu.uuid: gpu.index for gpu in found}
    busy: Dict[int, List[int]] = {}
    for line in output.splitlines():
        uuid, _, pid = (part.strip() for part in line.partition(","))
        if uuid in index and pid.isdigit():
            busy.setdefault(index[uuid], []).append(int(pid))
    return busy, None


def _nvidia_smi(arguments: Sequence[str]) -> Tuple[str, Optional[str]]:
    """nvidia-smi's output, or why there is none."""
    program = shutil.which(NVIDIA_SMI[0])
    if program is None:
        return "", "nvidia-smi not found on PATH"
    try:
        done = subprocess.run(
            [program, *arguments], capture_output=True, timeout=NVIDIA_SMI_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return "", "nvidia-smi failed: %s" % e
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        said = (output + done.stderr.decode(errors="replace")).strip().splitlines() or ["no output"]
        return "", "nvidia-smi exited with code %d: %s" % (done.returncode, said[-1])
    return output, None


def parse_gpus(lines: Sequence[str]) -> List[Gpu]:
    """`0, GPU-8f6e...` lines -> GPUs; ValueError naming a line that is not one."""
    found = []
    for line in lines:
        if not line.strip():
            continue
        index, comma, uuid = line.partition(",")
        if not comma or not index.strip().isdigit():
            raise ValueError(repr(line))
        found.append(Gpu(int(index), uuid.strip()))
    return found


def pin(cores: Sequence[int]) -> None:
    """Run this process, and every process it starts from now on, on these cores only.
    OSError when the host cannot (no such core, or no affinity on this system)."""
    if not hasattr(os, "sched_setaffinity"):
        raise OSError("this system cannot restrict a process to some cores")
    os.sched_setaffinity(0, cores)
