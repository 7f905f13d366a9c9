"""TensorFlow's log lines read one at a time: the task a line names, the lines that are known
noise, and the last line worth showing (not noise, not a traceback's frames or TF's trailers).
Pure and stdlib only, like `diagnose.py`, which reads a task's lines into findings with these.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

EVIDENCE_MAX = 300  # characters of a line quoted as evidence


# TensorFlow's device/task names: /job:ps/replica:0/task:0 -> "ps:0".
_TF_TASK = re.compile(r"/job:(?P<job>[\w.-]+)/replica:\d+/task:(?P<index>\d+)")


def tf_task_name(text: str) -> str | None:
    """The first `/job:X/replica:R/task:N` in text as tfctl's `X:N` (None for /job:localhost)."""
    m = _TF_TASK.search(text)
    if m is None or m.group("job") == "localhost":
        return None
    return f"{m.group('job')}:{m.group('index')}"


# Known-harmless lines (substrings). They are never the reason a task failed.
NOISE = (
    "failed call to cuInit",
    "Could not find cuda drivers",
    "Local rendezvous is aborting with status: ABORTED: Cleanup",
    "WARNING: All log messages before absl::InitializeLog() is called",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
    "oneDNN custom operations are on",
    "TF_ENABLE_ONEDNN_OPTS",
    "disable_resource_variables (from tensorflow",
    "non-resource variables are not supported in the long term",
    "is deprecated and will be removed",
    "Instructions for updating:",
    "MLIR V1 optimization pass is not enabled",
    "TF-TRT Warning: Could not find TensorRT",
    "Unable to register cuDNN factory",
    "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory",
    "computation placer already registered",
)


def is_noise(line: str) -> bool:
    """True for blank lines and known-harmless TensorFlow chatter (CUDA probing, oneDNN, deprecations)."""
    return not line.strip() or any(n in line for n in NOISE)


# Context around an error, not the error itself: traceback frames, TF's trailers and hints.
_CONTEXT = re.compile(
    r"\s+File \"|\s*[\^~]+\s*$|Traceback \(most recent call last\):|During handling of the above exception"
    r"|Original stack trace for |\s*\[\[\{\{node |Hint: If you want to see a list of allocated tensors"
    r"|The error could be from a previous operation|Additional GRPC error information|:UNKNOWN:Error received"
    r"|Detected at node |\s*$"
)
_FRAME = re.compile(r"\s+File \"")


def last_meaningful(lines: Iterable[str]) -> str | None:
    """The last line worth showing: not noise, not traceback frames or TensorFlow's error trailers.

    Also skipped: the free-text line after `Instructions for updating:` and the source line under
    a traceback's `File "...", line N`.
    """
    seq = lines if isinstance(lines, Sequence) else list(lines)
    for i in range(len(seq) - 1, -1, -1):
        line = seq[i]
        if is_noise(line) or _CONTEXT.match(line):
            continue
        if i > 0 and (
            seq[i - 1].strip() == "Instructions for updating:" or (line[:1].isspace() and _FRAME.match(seq[i - 1]))
        ):
            continue
        return trim(line)
    return None


def trim(line: str) -> str:
    line = line.strip()
    return line if len(line) <= EVIDENCE_MAX else line[: EVIDENCE_MAX - 3] + "..."
