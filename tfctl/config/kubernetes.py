"""The `kubernetes:` section of a cluster file: the pods `tfctl export tfjob|jobset|indexed-job` describe.

Checked as strictly as the rest of the file, but against Kubernetes' own rules for names, so a
manifest that `kubectl apply` would refuse is caught here, with the line to fix.
"""

from __future__ import annotations

import re
from typing import Any

from tfctl.config.base import INVALID, Doc, Section, Validator, _choice, _string
from tfctl.config.model import IMAGE_PULL_POLICIES, KubernetesSettings

# RFC 1123 label and subdomain, as Kubernetes validates namespaces and service accounts.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(_LABEL)
_SUBDOMAIN_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def _image(doc: Doc, path: str, value: Any) -> Any:
    image = _string(doc, path, value, "image: tensorflow/tensorflow:2.16.1")
    if image is INVALID or not re.search(r"\s", image):
        return image
    return doc.problem(
        path, f"`{image}` is not an image reference: it has spaces", "e.g. `image: registry/team/train:1.0`"
    )


def _k8s_name(pattern: re.Pattern[str], limit: int, kind: str, example: str) -> Validator:
    """A name Kubernetes accepts: lowercase letters, digits and `-` (and `.` in a subdomain)."""

    def validate(doc: Doc, path: str, value: Any) -> Any:
        name = _string(doc, path, value, example)
        if name is INVALID or (pattern.fullmatch(name) and len(name) <= limit):
            return name
        allowed = "`-` or `.`" if pattern is _SUBDOMAIN_RE else "`-`"
        return doc.problem(
            path,
            f"`{name}` is not a valid Kubernetes {kind}",
            f"use at most {limit} lowercase letters, digits and {allowed}, "
            f"starting and ending with a letter or digit, e.g. `{example}`",
        )

    return validate


def _container_dir(doc: Doc, path: str, value: Any) -> Any:
    """An absolute path: inside the image there is no cluster-file directory to be relative to."""
    text = _string(doc, path, value, "workdir: /app")
    if text is INVALID or text.startswith("/"):
        return text
    return doc.problem(
        path, f"`{text}` is relative; a container's working directory is absolute", f"e.g. `workdir: /{text}`"
    )


_kubernetes = Section(
    {
        "image": _image,
        "namespace": _k8s_name(_LABEL_RE, 63, "namespace", "namespace: ml-team"),
        "image_pull_policy": _choice(
            IMAGE_PULL_POLICIES, "Kubernetes spells them exactly so, e.g. `image_pull_policy: IfNotPresent`"
        ),
        "service_account": _k8s_name(_SUBDOMAIN_RE, 253, "service account name", "service_account: trainer"),
        "workdir": _container_dir,
    },
    KubernetesSettings,
    "kubernetes: {image: tensorflow/tensorflow:2.16.1}",
)


# One line per key for the generated reference (see `key_docs.py`).
KEY_DOCS: dict[str, str] = {
    "kubernetes.image": "The container image every pod runs; unset: the job's `container.image`.",
    "kubernetes.namespace": "Namespace of the exported objects (TFJob, JobSet, Job and Service).",
    "kubernetes.image_pull_policy": "`Always`, `IfNotPresent` or `Never`, as Kubernetes spells them.",
    "kubernetes.service_account": "Service account the pods run as.",
    "kubernetes.workdir": "The container's working directory (absolute).",
}
