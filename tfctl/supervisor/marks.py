"""The recent output lines that match a pattern, with the time each was written.

The controller knows what progress looks like (`tfctl.tf.progress` builds the pattern); the host
only finds the lines, reading its log backwards from the end, and only as far as needed: until
the marks reach back past the window, and a little further for rare lines (a Keras `Epoch 3/10`)
that give the frequent ones their meaning. `\\r` ends a line as `\\n` does, and backspaces and colour
codes are dropped, so a progress bar redrawn in place counts as each of its states.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

from .protocol import Mark, ProgressRule
from .timeline import Timeline

BLOCK = 64 * 1024
ENOUGH_CONTEXT = 512 * 1024  # read this far back once the window is covered, for rare lines
MAX_SCAN = 4 * 1024 * 1024
NEWEST_KEPT = 8  # of each kind of line, the newest few are all kept; older ones the oldest per bucket
MAX_TEXT = 200
MAX_LINE = 4 * BLOCK  # a longer line is no progress line: skipped
SEGMENT = re.compile(rb"[^\r\n]+")
LINE_END = re.compile(rb"[\r\n]")
TERMINAL_CODES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x08")  # colours (Keras 3 writes them to files too)


def recent_marks(log_path: str, rule: ProgressRule, now: float) -> List[Mark]:
    """Marks oldest first."""
    try:
        f = open(log_path, "rb")
    except OSError:
        return []
    pattern = re.compile(rule.pattern.encode("utf-8"))
    with f, Timeline(log_path) as timeline:
        end = os.fstat(f.fileno()).st_size
        if end == 0:
            return []
        start = max(0, end - MAX_SCAN)
        date = timeline.dater(start, end)
        kept: List[Tuple[int, bytes, float]] = []
        newest: Dict[str, int] = {}
        last_bucket: Dict[str, int] = {}
        bucket_mark: Dict[str, int] = {}  # kind -> index in `kept` of its current bucket's mark (-1: none to replace)
        horizon = now - rule.window
        covered_at: Optional[int] = None
        pos, carry = end, b""
        while pos > start:
            step = min(BLOCK, pos - start)
            pos -= step
            f.seek(pos)
            block = f.read(step) + carry
            # The first segment may continue in the block before: keep it for the next round.
            cut = 0 if pos == start else _first_line_end(block)
            carry = block[:cut] if cut < MAX_LINE else b""
            for m in reversed(list(SEGMENT.finditer(block, cut))):
                text = TERMINAL_CODES.sub(b"", m.group())
                found = pattern.search(text)
                if found is None:
                    continue
                kind = found.lastgroup or ""
                written = date(pos + m.end() - 1)
                seen = newest.get(kind, 0)
                bucket = int(written // (rule.window / rule.buckets)) if rule.window > 0 and rule.buckets > 0 else 0
                mark = (pos + m.start(), text[:MAX_TEXT], written)
                if seen < NEWEST_KEPT or last_bucket.get(kind) != bucket:
                    kept.append(mark)
                    newest[kind] = seen + 1
                    last_bucket[kind] = bucket
                    bucket_mark[kind] = len(kept) - 1 if seen >= NEWEST_KEPT else -1
                elif bucket_mark.get(kind, -1) >= 0:
                    kept[bucket_mark[kind]] = mark  # a bucket keeps its oldest mark: rates start there
                else:  # the bucket of the newest marks: one more, its oldest
                    kept.append(mark)
                    bucket_mark[kind] = len(kept) - 1
                if written < horizon and covered_at is None:
                    covered_at = pos
            if covered_at is not None and covered_at - pos >= ENOUGH_CONTEXT:
                break
        return [Mark(written, text.decode("utf-8", "replace").strip()) for _, text, written in reversed(kept)]


def _first_line_end(block: bytes) -> int:
    """Where the first complete segment of a block starts (after its first \\r or \\n)."""
    found = LINE_END.search(block)
    return found.end() if found else len(block)
