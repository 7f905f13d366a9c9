"""Stand-in GPUs for podman's CDI path: `podman run --device nvidia.com/gpu=K` on a machine with no GPU.

Each GPU K is a character device node of the lab's (a copy of /dev/null's numbers, harmless),
`<base>/dev/nvidiaK`, which a CDI spec (`kind: nvidia.com/gpu`, device `K`) puts in the container
as /dev/nvidiaK: a task sees which of the host's GPUs it was given by the nodes it has.

podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi (`cdi_spec_dirs` in containers.conf
came later), and the machine's files stay untouched: the spec is seen at /etc/cdi in a mount
namespace of the lab's own, kept by a bind mount of its namespace file, where /etc is a tmpfs
holding bind mounts of every entry of the real /etc plus `cdi`. A `podman` on the lab's PATH
enters that namespace and runs the real one, so every podman command of a test (runs, stops,
removals, and the cleanups conmon starts) shares it and sees the same mounts.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

KIND = "nvidia.com/gpu"
DEVICE = os.makedev(1, 3)  # /dev/null's: reading and writing it does nothing
# Run in the new namespace: /etc again, as a tmpfs of bind mounts of the real one, plus cdi/.
MOUNT_ETC = """set -e
etc=$1 specs=$2
mount -t tmpfs -o mode=755 tfctl-stand-in-etc "$etc"
for entry in /etc/* /etc/.[!.]*; do
  [ -e "$entry" ] || [ -L "$entry" ] || continue
  copy="$etc/${entry#/etc/}"
  if [ -L "$entry" ]; then cp -P "$entry" "$copy"
  elif [ -d "$entry" ]; then mkdir "$copy" && mount --rbind "$entry" "$copy"
  else : >"$copy" && mount --bind "$entry" "$copy"
  fi
done
mkdir "$etc/cdi"
mount --bind "$specs" "$etc/cdi"
mount --move "$etc" /etc
"""


def cdi_spec(dev: Path, count: int) -> dict:
    """The CDI spec of `count` stand-in GPUs, named 0 to count-1 as nvidia-smi numbers them."""
    nodes = [{"path": f"/dev/nvidia{k}", "hostPath": str(dev / f"nvidia{k}")} for k in range(count)]
    devices = [{"name": str(k), "containerEdits": {"deviceNodes": [node]}} for k, node in enumerate(nodes)]
    return {"cdiVersion": "0.5.0", "kind": KIND, "devices": devices}


class StandInGpus:
    """`count` stand-in GPUs for podman, while in a `with` block, for the podman in `bin` (put it
    first on PATH)."""

    def __init__(self, base: Path, count: int) -> None:
        self.base = base
        self.count = count
        self.namespace = base / "ns" / "mnt"
        self.bin = base / "bin"

    def __enter__(self) -> "StandInGpus":
        podman = shutil.which("podman")
        if podman is None:
            raise RuntimeError("podman is not on PATH")
        dev, specs, etc = self.base / "dev", self.base / "cdi", self.base / "etc"
        for folder in (dev, specs, etc, self.bin, self.namespace.parent):
            folder.mkdir(parents=True, exist_ok=True)
        for k in range(self.count):
            os.mknod(dev / f"nvidia{k}", stat.S_IFCHR | 0o666, DEVICE)
        (specs / "stand-in-gpus.json").write_text(json.dumps(cdi_spec(dev, self.count), indent=1))
        # The namespace file is bind-mounted onto: its folder must be a mount that is not shared.
        held = str(self.namespace.parent)
        subprocess.run(["mount", "--bind", held, held], check=True)
        try:
            subprocess.run(["mount", "--make-private", held], check=True)
            self.namespace.touch()
            subprocess.run(
                ["unshare", f"--mount={self.namespace}", "--propagation", "private", "sh", "-c", MOUNT_ETC, "sh"]
                + [str(etc), str(specs)],
                check=True,
                capture_output=True,
                timeout=60,
            )
        except BaseException:
            self.__exit__()
            raise
        wrapper = self.bin / "podman"
        wrapper.write_text(f'#!/bin/sh\nexec nsenter --mount={self.namespace} -- {podman} "$@"\n')
        wrapper.chmod(0o755)
        return self

    def __exit__(self, *_exc: object) -> None:
        """The namespace goes once its file is unmounted and the last process in it has ended."""
        for point in (self.namespace, self.namespace.parent):
            subprocess.run(["umount", str(point)], capture_output=True)
