"""Reading a W&B offline run's `.wandb` file, written by W&B itself: the LevelDB log format its
datastore writes (a 7-byte header, 32 KiB blocks of checksummed chunks) around protobuf records."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def chunks(data: bytes) -> Iterator[bytes]:
    assert data[:4] == b":W&B", data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
        else:
            return


@dataclass
class OfflineRun:
    run_id: str = ""
    project: str = ""
    group: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    kinds: set[str] = field(default_factory=set)


def read(path: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2

    run = OfflineRun()
    for raw in chunks(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        run.kinds.add(kind)
        if kind == "run":
            run.run_id, run.project, run.group = record.run.run_id, record.run.project, record.run.run_group
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            run.summary.update({_key(i): json.loads(i.value_json) for i in record.summary.update})
    return run


def _key(item: Any) -> str:
    """A flat key, or a nested one (`_wandb/runtime`) as W&B writes those."""
    return str(item.key or "/".join(item.nested_key))
