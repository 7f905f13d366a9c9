"""The `container:` section, at the top level and in a job: the image each task runs in.

Checked as strictly as the rest of the file: a mount is `host:container[:options]` with absolute
paths, options are a list (they reach the runtime as arguments, never through a shell).
"""

from __future__ import annotations

import re
from typing import Any

from tfctl.config.base import INVALID, Doc, Section, _choice, _seconds, _string, type_error
from tfctl.config.model import CONTAINER_RUNTIMES, DEFAULT_PULL_TIMEOUT, ContainerSettings

_MOUNT_OPTIONS = re.compile(r"[A-Za-z0-9,=_-]+")


def _image(doc: Doc, path: str, value: Any) -> Any:
    image = _string(doc, path, value, "image: tensorflow/tensorflow:2.16.1")
    if image is INVALID or not re.search(r"\s", image):
        return image
    return doc.problem(
        path,
        f"`{image}` is not an image: it has spaces",
        "name an image (`registry/team/train:1.0`) or a rootfs folder",
    )


def _mounts(doc: Doc, path: str, value: Any) -> Any:
    """`host:container[:options]`, both absolute: the container sees the host folder there."""
    example = "mounts: [/data:/data:ro]"
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return type_error(doc, path, "a list of host:container[:options]", value, f"e.g. `{example}`")
    for i, mount in enumerate(value):
        parts = mount.split(":")
        valid = len(parts) in (2, 3) and all(p.startswith("/") for p in parts[:2])
        if valid and len(parts) == 3:
            valid = bool(_MOUNT_OPTIONS.fullmatch(parts[2]))
        if not valid:
            return doc.problem(
                f"{path}[{i}]",
                f"`{mount}` is not a mount",
                f"write `/host/path:/container/path` or with options `...:ro`, both absolute, e.g. `{example}`",
            )
    return tuple(value)


def _options(doc: Doc, path: str, value: Any) -> Any:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        return type_error(
            doc, path, "a list of runtime arguments", value, 'one argument per item, e.g. `options: ["--shm-size=1g"]`'
        )
    return tuple(value)


def _container_python(doc: Doc, path: str, value: Any) -> Any:
    text = _string(doc, path, value, "python: /usr/bin/python3")
    if text is INVALID or text.startswith("/"):
        return text
    return doc.problem(path, f"`{text}` is relative: it names a path in the image", "e.g. `python: /usr/bin/python3`")


_container = Section(
    {
        "image": _image,
        "runtime": _choice(CONTAINER_RUNTIMES, "`auto` takes the first of podman, docker, apptainer a host has"),
        "mounts": _mounts,
        "options": _options,
        "python": _container_python,
        "pull_timeout": _seconds(DEFAULT_PULL_TIMEOUT),
    },
    ContainerSettings,
    "container: {image: tensorflow/tensorflow:2.16.1}",
    {"image": "add `image: tensorflow/tensorflow:2.16.1` (or a local image, or a rootfs folder) under `container`"},
)


# One line per key for the generated reference (see `key_docs.py`).
KEY_DOCS: dict[str, str] = {
    "container": "Run every task in a container of this image (a job's own `container` wins).",
    "jobs.<job>.container": "The job's own `container` (same keys), instead of the top-level one.",
    "container.image": (
        "The image: a name the runtime knows or pulls, an image tarball (`/path/image.tar`, loaded in"
        " preflight), or a rootfs folder (absolute path)."
    ),
    "container.runtime": "`auto` (the first of podman, docker, apptainer a host has), `podman`, `docker`, `apptainer`.",
    "container.mounts": "More `host:container[:ro]` mounts; the workdir and the run's folder are mounted for you.",
    "container.options": "More runtime arguments, one per item, passed as they are (never through a shell).",
    "container.python": "The image's interpreter, `{python}` in commands (default: `python3` on the image's PATH).",
    "container.pull_timeout": (
        "Seconds a pull, or a tarball's load, may take in preflight (apart from `startup_timeout`; default 600)."
    ),
}
# A job's own section has the same keys, meaning the same for its tasks.
KEY_DOCS.update({f"jobs.<job>.{key}": doc for key, doc in list(KEY_DOCS.items()) if key.startswith("container.")})
