"""TensorFlow's healthy noise, folded from what `up` and `logs -f` show live.

Every TF process starts with a dozen lines that say nothing is wrong (absl's InitializeLog
banner, the CUDA stub on a machine without GPUs, CPU instructions TF was not built for, oneDNN,
factories registered twice, deprecation notices with their "Instructions for updating", the MLIR
pass and the coordination service starting with each session), and a
healthy parameter-server run logs `local_rendezvous ... ABORTED: Cleanup` as it goes. Users
silence them with TF_CPP_MIN_LOG_LEVEL=2 and so blind tfctl's diagnosis; folding them here keeps
the first screen readable while the stored log and the diagnosis still see every byte.
"""

from __future__ import annotations

import re
from typing import Iterable

from tfctl.tf.log_lines import last_meaningful

_GLOG = r"[IWE]\d{4} [\d:.]+ +\d+ "  # TF's C++ log line head (never F: a fatal is news)
NOISE = re.compile(
    "|".join(
        [
            r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
            _GLOG + r"cudart_stub\.cc:\d+\] Could not find cuda drivers",
            _GLOG + r"cuda_(?:platform|executor|diagnostics)\.cc:\d+\] (?:failed call to cuInit|.*kernel driver)",
            _GLOG + r"cpu_feature_guard\.cc:\d+\] ",
            r"To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$",
            _GLOG + r"port\.cc:\d+\] oneDNN custom operations are on",
            _GLOG + r"\w+\.cc:\d+\] Unable to register cu\w+ factory",
            _GLOG + r"computation_placer\.cc:\d+\] computation placer already registered",
            _GLOG + r"mlir_graph_optimization_pass\.cc:\d+\] MLIR V1 optimization pass is not enabled",
            _GLOG + r"coordination_service\.cc:\d+\] Initializing CoordinationService",
            r"TF-TRT Warning: Could not find TensorRT$",
            _GLOG + r"local_rendezvous\.cc:\d+\] Local rendezvous is aborting with status: ABORTED: Cleanup",
        ]
    )
)
DEPRECATION = re.compile(r"WARNING:tensorflow:From .*: .*(?:is deprecated|will be removed in a future version)")
INSTRUCTIONS = "Instructions for updating:"


class NoiseFolder:
    """Folds each task's healthy TF noise from a live stream; once per task, when its first
    line worth showing comes, says how many lines were folded before it and how to see them."""

    def __init__(self) -> None:
        self.folded: dict[str, int] = {}
        self._told: set[str] = set()
        self._deprecation: dict[str, str] = {}  # task -> "warned" or "instructions": within a notice

    def fold(self, task: str, lines: Iterable[str]) -> list[str]:
        """The lines to show, with the one note in front of the first of them."""
        shown: list[str] = []
        for line in lines:
            if self._is_noise(task, line):
                self.folded[task] = self.folded.get(task, 0) + 1
                continue
            if task not in self._told and self.folded.get(task):
                self._told.add(task)
                shown.append(self.note(task))
            shown.append(line)
        return shown

    def note(self, task: str) -> str:
        count = self.folded[task]
        return (
            f"(tfctl folded {count} line{'s' if count != 1 else ''} of TensorFlow's healthy start-up noise; "
            f"`tfctl logs {task}` shows every line)"
        )

    def _is_noise(self, task: str, line: str) -> bool:
        """A deprecation notice is its warning, then `Instructions for updating:` and one line of
        them; anything else after the warning is news again."""
        stage = self._deprecation.pop(task, None)
        if stage == "warned" and line.startswith(INSTRUCTIONS):
            self._deprecation[task] = "instructions"
            return True
        if stage == "instructions":
            return True
        if DEPRECATION.match(line):
            self._deprecation[task] = "warned"
            return True
        return NOISE.match(line) is not None


def last_shown(lines: Iterable[str]) -> str | None:
    """The last line worth showing that `logs` does not fold either: `status`'s LAST LINE. The
    diagnosis reads `last_meaningful` alone (a CoordinationService line says a session is up)."""
    return last_meaningful(NoiseFolder().fold("", lines))
