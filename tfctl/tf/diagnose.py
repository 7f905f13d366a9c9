"""Why is this task stuck or dead? Known TensorFlow log lines -> a cause and a fix.

Pure logic: no I/O, no TensorFlow, standard library only, and cheap enough to run on every log
line live (`tfctl up`, `tfctl logs -f`).
Three steps:

- `match_line(task, line)`: one line against the pattern table -> a generic `Finding` or None.
- `diagnose(task, lines)`: a task's recent lines -> the newest finding of each kind, most
  important first. Multi-line context is handled here: the peer named on the line after an error
  (`Additional GRPC error information from remote target /job:ps/...`), MWMS stragglers listed
  under `Example stragglers:`, and waits that are over (a later line shows progress).

`explain.py` then cross-checks a finding with what tfctl knows about the other tasks.

Every pattern but two was checked against real TensorFlow 2.21 output (tests/data/tf_logs/); the
exceptions, `Address already in use` and `Socket closed`, are older gRPC wordings that 2.21 did not
produce in those scenarios (it says `Failed to add port` and `Connection reset by peer` instead).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from tfctl.tf.log_lines import EVIDENCE_MAX, is_noise, tf_task_name, trim


class Kind(str, enum.Enum):
    """What a finding is about. Most important first: a root cause beats its symptoms."""

    PORT_IN_USE = "port_in_use"
    BAD_CLUSTER_SPEC = "bad_cluster_spec"
    OOM = "oom"
    NAN_LOSS = "nan_loss"
    PEER_DIED = "peer_died"
    WAITING_FOR_PEER = "waiting_for_peer"
    MWMS_WAITING = "mwms_waiting"
    WAITING_FOR_MODEL = "waiting_for_model"
    STEP_CANCELLED = "step_cancelled"
    UNKNOWN_FAILURE = "unknown_failure"

    def __str__(self) -> str:
        return self.value


# Kinds that describe a wait (or a suspicion of one): a later line showing progress ends them.
CLEARED_BY_PROGRESS = (Kind.WAITING_FOR_PEER, Kind.MWMS_WAITING, Kind.WAITING_FOR_MODEL, Kind.STEP_CANCELLED)
WAITS = (Kind.WAITING_FOR_PEER, Kind.MWMS_WAITING, Kind.WAITING_FOR_MODEL)  # TF waits for these for ever
DEVICE_FILTERS_FIX = (
    'give the session tf.ConfigProto(device_filters=["/job:ps", "/job:worker/task:%d" % task_index])'
    " so it waits only for the ps and itself"
)


@dataclass(frozen=True)
class Finding:
    kind: Kind
    task: str  # the task whose log shows it, e.g. "worker:1"
    cause: str  # one line: what is going on
    fix: str  # one line: what to do
    evidence: str  # the log line (trimmed)
    peer: str | None = None  # the task the log names, e.g. "ps:0" (from /job:ps/replica:0/task:0)
    repeats: int = 1  # how many lines in a row (no progress between) said it


# ---------------------------------------------------------------------------------- pattern table

_DTYPE_BYTES = {
    **{"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2, "int32": 4},
    **{"int64": 8, "bool": 1, "complex64": 8, "complex128": 16},
}


def _size(shape: str, dtype: str) -> str:
    if dtype not in _DTYPE_BYTES or not shape:
        return ""
    n = _DTYPE_BYTES[dtype]
    for d in shape.split(","):
        n *= int(d)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _waiting_for_peer(task: str, m: re.Match) -> tuple[str, str]:
    peer = tf_task_name(m.group(0)) or "?"
    if task.split(":")[0] in ("worker", "chief") and peer.split(":")[0] in ("worker", "chief"):
        return (
            f"CreateSession waits for {peer}, but a worker never needs another worker: "
            "this session has no device filters, so it waits for every task of the cluster",
            DEVICE_FILTERS_FIX,
        )
    return (
        f"the session cannot start: TensorFlow is still waiting for {peer} to answer (CreateSession)",
        f"make sure {peer} runs and listens on the address in this task's cluster spec "
        f"(`tfctl status`, `tfctl logs {peer}`)",
    )


def _waiting_for_model(task: str, m: re.Match) -> tuple[str, str]:
    missing = m.group("vars")
    what = f" (not initialized: {missing.strip()})" if missing else ""
    return (
        "non-chief MonitoredTrainingSession waits for the chief to initialise the variables"
        f"{what}; it looks again every 30 s",
        "start the chief (chief:0, else worker:0) and check its log: it must get past its own "
        "CreateSession and initialise the variables",
    )


def _mwms_waiting(task: str, m: re.Match) -> tuple[str, str] | None:
    n, total = int(m.group("n")), int(m.group("m"))
    if n == 0:
        return None  # "Waiting for 0/2 tasks": everyone is there
    return (
        f"MultiWorkerMirroredStrategy cannot start: {n} of {total} tasks have not connected to the "
        "coordination service",
        "start every task of TF_CONFIG's cluster; each must have the same cluster and its own task index",
    )


def _stragglers(task: str, m: re.Match) -> tuple[str, str]:
    return (
        "MultiWorkerMirroredStrategy cannot start: some tasks have not connected to the coordination service",
        "start every task of TF_CONFIG's cluster; each must have the same cluster and its own task index",
    )


def _port_in_use(task: str, m: re.Match) -> tuple[str, str]:
    port = m.groupdict().get("port")
    cause = f"could not bind port {port}: another process already listens there" if port else "could not start"
    return (
        f"this task's TensorFlow server {cause}" + ("" if port else ": its port is most likely taken"),
        f"find the holder with `ss -ltnp 'sport = :{port or 'PORT'}'` on this host; a live run of another "
        "cluster file stops with `tfctl -f ITS_FILE down` (`tfctl runs` lists them), what a crashed run "
        "left with `tfctl down --all`; or write this host without a port, so a free one is chosen at start",
    )


def _bad_cluster_spec(task: str, m: re.Match) -> tuple[str, str]:
    if m.groupdict().get("index") is not None:
        what = f'has no task {m.group("index")} in job "{m.group("job")}" (task index beyond its host list)'
    else:
        what = f'has no job "{m.group("job")}"'
    return (
        f"the cluster spec this task built {what}",
        "build the cluster from TF_CONFIG (tfctl sets it) or from the {ps_hosts}/{worker_hosts} and "
        "{task_index} placeholders, not from hard-coded host lists",
    )


def _oom(task: str, m: re.Match) -> tuple[str, str]:
    if m.groupdict().get("shape") is not None:
        shape, dtype, device = m.group("shape"), m.group("dtype"), m.group("device").rsplit("/", 1)[-1]
        size = _size(shape, dtype)
        return (
            f"out of memory: TensorFlow could not allocate a [{shape}] {dtype} tensor"
            f"{f' ({size})' if size else ''} on {device}",
            "reduce the batch size or the layer sizes that make this tensor, or run the task on a host "
            "with more free memory (check `free -g` and `ulimit -v` there)",
        )
    return (
        "out of memory (ResourceExhaustedError)",
        "reduce the batch size or the model size, or run the task on a host with more free memory",
    )


def _nan(task: str, m: re.Match) -> tuple[str, str]:
    fix = (
        "lower the learning rate or clip gradients (tf.clip_by_global_norm), guard log/sqrt/division "
        "inputs (tf.math.log(x + 1e-7)), check the input data for NaN/Inf; "
        "tf.debugging.enable_check_numerics() names the first op producing it"
    )
    if m.groupdict().get("what"):
        label = (m.group("msg") or "").strip()
        return (f"check_numerics{f' {label!r}' if label else ''} found {m.group('what')} values", fix)
    return ("the loss became NaN: training diverged (NanTensorHook stopped it)", fix)


def _peer_died_for(peer: str) -> tuple[str, str]:
    return (
        f"lost the connection to {peer}: it exited, was killed, or became unreachable",
        f"see how {peer} ended (`tfctl status`, `tfctl logs {peer}`); a dead ps or MWMS worker "
        "means restarting the run (from a checkpoint if there is one)",
    )


def _peer_died(task: str, m: re.Match) -> tuple[str, str]:
    peer = tf_task_name(m.string)
    if peer and peer != task:
        return _peer_died_for(peer)
    return (
        "a connection to another task failed (UNAVAILABLE): a peer exited, was killed, or became unreachable",
        "find the task that ended in `tfctl status` and read its log; then restart the run "
        "(from a checkpoint if there is one)",
    )


def _step_cancelled(task: str, m: re.Match) -> tuple[str, str]:
    return (
        "a running step was cancelled; in TF1 between-graph training this is often the only trace of a "
        "ps dying: the worker then hangs without any error",
        "check the ps tasks in `tfctl status` and restart the run if one ended; TF 2.21 never times this "
        "out (GRPC_FAIL_FAST=true in env turns it into UNAVAILABLE errors)",
    )


_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?P<exc>[A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(?P<msg>.*))?$")


def _unknown(task: str, m: re.Match) -> tuple[str, str]:
    msg = (m.group("msg") or "").strip()
    return (
        f"the task failed with {m.group('exc')}{': ' + msg if msg else ''}"[:EVIDENCE_MAX],
        f"read the traceback above this line: `tfctl logs --tail 60 {task}`",
    )


@dataclass(frozen=True)
class _Pattern:
    kind: Kind
    needle: str  # literal substring that must be in the line (cheap pre-check)
    regex: re.Pattern
    build: Callable  # (task, match) -> (cause, fix) or None
    specific: bool = True  # a generic match never replaces a specific one of the same kind


_TASK_RE = r"/job:[\w.-]+/replica:\d+/task:\d+"
_STRAGGLERS = "Example stragglers:"  # the straggler names follow, one per line
# Order matters: the first pattern whose needle and regex match a line wins.
PATTERNS: tuple[_Pattern, ...] = (
    _Pattern(
        Kind.PORT_IN_USE,
        "Failed to add port to server",
        re.compile(r"Failed to add port to server.*?:(?P<port>\d+)'"),
        _port_in_use,
    ),
    # Older gRPC wording; TF 2.21 says "Failed to add port ... No address added" for a taken port.
    _Pattern(
        Kind.PORT_IN_USE,
        "Address already in use",
        re.compile(r"Address already in use(?:.*?:(?P<port>\d+)\b)?"),
        _port_in_use,
    ),
    _Pattern(
        Kind.PORT_IN_USE,
        "Could not start gRPC server",
        re.compile(r"Could not start gRPC server"),
        _port_in_use,
        specific=False,
    ),
    _Pattern(
        Kind.BAD_CLUSTER_SPEC,
        "was not defined in",
        re.compile(r'Task (?P<index>\d+) was not defined in job "(?P<job>[^"]+)"'),
        _bad_cluster_spec,
    ),
    _Pattern(
        Kind.BAD_CLUSTER_SPEC,
        "was not defined in",
        re.compile(r'Job "(?P<job>[^"]+)" was not defined in cluster'),
        _bad_cluster_spec,
    ),
    _Pattern(
        Kind.OOM,
        "OOM when allocating",
        re.compile(
            r"OOM when allocating tensor with shape\[(?P<shape>[\d,]*)\] and type (?P<dtype>\w+) "
            r"on (?P<device>\S+)"
        ),
        _oom,
    ),
    _Pattern(
        Kind.OOM,
        "ResourceExhausted",
        re.compile(r"^(?!.*larger than max).*ResourceExhaustedError"),
        _oom,
        specific=False,
    ),
    _Pattern(
        Kind.OOM, "RESOURCE_EXHAUSTED", re.compile(r"^(?!.*larger than max).*RESOURCE_EXHAUSTED"), _oom, specific=False
    ),
    _Pattern(Kind.NAN_LOSS, "NaN loss during training", re.compile(r"NaN loss during training"), _nan),
    _Pattern(Kind.NAN_LOSS, "Model diverged with loss = NaN", re.compile(r"Model diverged with loss = NaN"), _nan),
    _Pattern(
        Kind.NAN_LOSS,
        "Tensor had ",
        re.compile(r"(?:(?P<msg>[^:{}\]\[]*?) : )?Tensor had (?P<what>[A-Za-z ]+?) values"),
        _nan,
    ),
    _Pattern(
        Kind.PEER_DIED,
        "CreateSession failed because worker",
        re.compile(rf"CreateSession failed because worker {_TASK_RE} returned error: UNAVAILABLE"),
        _peer_died,
    ),
    _Pattern(Kind.PEER_DIED, "Collective ops is aborted by", re.compile(r"Collective ops is aborted by"), _peer_died),
    # Older gRPC wording, not seen with TF 2.21 (a killed peer gave "Connection reset by peer").
    _Pattern(Kind.PEER_DIED, "Socket closed", re.compile(r"Socket closed"), _peer_died, specific=False),
    _Pattern(
        Kind.PEER_DIED, "Connection reset by peer", re.compile(r"Connection reset by peer"), _peer_died, specific=False
    ),
    _Pattern(
        Kind.PEER_DIED,
        "failed to connect to all addresses",
        re.compile(r"failed to connect to all addresses"),
        _peer_died,
        specific=False,
    ),
    _Pattern(Kind.PEER_DIED, "UNAVAILABLE", re.compile(r"\bUNAVAILABLE\b"), _peer_died, specific=False),
    _Pattern(Kind.PEER_DIED, "UnavailableError", re.compile(r"UnavailableError"), _peer_died, specific=False),
    _Pattern(
        Kind.WAITING_FOR_PEER,
        "CreateSession still waiting",
        re.compile(rf"CreateSession still waiting for response from worker: {_TASK_RE}"),
        _waiting_for_peer,
    ),
    _Pattern(
        Kind.MWMS_WAITING,
        "tasks to connect",
        re.compile(r"Waiting for (?P<n>\d+)/(?P<m>\d+) tasks to connect"),
        _mwms_waiting,
    ),
    _Pattern(Kind.MWMS_WAITING, _STRAGGLERS, re.compile(_STRAGGLERS), _stragglers, specific=False),
    _Pattern(
        Kind.WAITING_FOR_MODEL,
        "Waiting for model to be ready",
        re.compile(
            r"Waiting for model to be ready(?:.*?Variables not initialized: (?P<vars>.*?)"
            r"(?:, ready:.*)?$)?"
        ),
        _waiting_for_model,
    ),
    _Pattern(
        Kind.STEP_CANCELLED,
        "Cancellation requested for RunGraph",
        re.compile(r"Cancellation requested for RunGraph"),
        _step_cancelled,
        specific=False,
    ),
    _Pattern(
        Kind.STEP_CANCELLED,
        "Local rendezvous send item cancelled",
        re.compile(r"Local rendezvous send item cancelled"),
        _step_cancelled,
        specific=False,
    ),
)
_UNKNOWN = _Pattern(Kind.UNKNOWN_FAILURE, "", _EXCEPTION, _unknown, specific=False)
# One pass over the line decides whether any pattern can match at all (most lines: none).
_TRIGGER = re.compile("|".join(sorted({re.escape(p.needle) for p in PATTERNS}, key=len, reverse=True)))


def _match(task: str, line: str) -> tuple[Finding, _Pattern] | None:
    if _TRIGGER.search(line) is not None:
        if is_noise(line):
            return None
        for p in PATTERNS:
            if p.needle in line:
                m = p.regex.search(line)
                if m is not None:
                    built = p.build(task, m)
                    if built is None:
                        return None
                    peer = tf_task_name(line) if p.kind in (Kind.WAITING_FOR_PEER, Kind.PEER_DIED) else None
                    if peer == task:
                        peer = None  # its own device, not a peer
                    return Finding(p.kind, task, built[0], built[1], trim(line), peer), p
        return None
    if line[:1].isalpha() and ("Error" in line or "Exception" in line or "Exit" in line or "Interrupt" in line):
        m = _EXCEPTION.match(line.rstrip())
        if m is not None:
            cause, fix = _unknown(task, m)
            return Finding(Kind.UNKNOWN_FAILURE, task, cause, fix, trim(line)), _UNKNOWN
    return None


def match_line(task: str, line: str) -> Finding | None:
    """The finding one log line shows, with a generic cause and fix; None for most lines."""
    found = _match(task, line)
    return found[0] if found else None


# ---------------------------------------------------------------------------------------- diagnose

# Lines TensorFlow writes by itself (C++ glog lines, tf.logging, continuation lines, tracebacks'
# inner lines): while a task waits these keep coming and do not mean it made progress.
_TF_CHATTER = re.compile(
    r"[IWEF]\d{4} [\d:.]+ +\d+ [\w.\-]+:\d+\]"
    r"|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL|FATAL):tensorflow:"
    r"|/job:|Additional GRPC error information|:UNKNOWN:|\s|\[\["
)
# TF's lines once a session is ready (tf.train.Supervisor's services); local init too, unless a
# "Waiting for model" follows: Supervisor runs it before each readiness check.
_SESSION_READY = r"Starting queue runners|Starting standard services"
_LOCAL_INIT_DONE = "Done running local_init_op"
_PROGRESS = re.compile(r"Waiting for 0/\d+ tasks to connect|has passed with status: OK|" + _SESSION_READY)
_REMOTE_TARGET = re.compile(rf"remote target (?P<t>{_TASK_RE})")
_STRAGGLER = re.compile(rf"^\s*(?P<t>{_TASK_RE})\s*$")
PEER_LOOKAHEAD = 3  # a peer named this many lines after a peer-less finding is that finding's peer


def _score(finding: Finding, pattern: _Pattern) -> int:
    return (finding.peer is not None) + pattern.specific


def diagnose(task: str, lines: Iterable[str]) -> list[Finding]:
    """The newest finding of each kind in a task's recent lines, most important first.

    A finding naming a peer, or from a specific pattern, is not replaced by a vaguer one of the
    same kind. Waits a later line shows to be over (progress printed by the program, `Waiting for
    0/N tasks`, a barrier passed) are dropped, and so is a cancelled step a peer's death explains.
    """
    current: dict[Kind, tuple[Finding, _Pattern]] = {}
    open_kind: Kind | None = None  # the last peer-less finding, waiting for a peer on the next lines
    open_age = 0
    stragglers: list[str] = []
    in_stragglers = False
    for line in lines:
        if in_stragglers:
            s = _STRAGGLER.match(line)
            if s is not None:
                name = tf_task_name(s.group("t"))
                if name:
                    stragglers.append(name)
                    _set_stragglers(current, stragglers)
                continue
            in_stragglers = False
        found = _match(task, line)
        if found is not None:
            finding, pattern = found
            if pattern.needle == _STRAGGLERS:
                in_stragglers = True
                stragglers = []
                inline = tf_task_name(line)
                if inline:
                    stragglers.append(inline)
                if Kind.MWMS_WAITING in current:
                    _set_stragglers(current, stragglers)
                    continue
            old = current.get(finding.kind)
            if old is not None and finding.kind in CLEARED_BY_PROGRESS:
                finding = replace(finding, repeats=old[0].repeats + 1)
            # A vaguer line does not replace a precise one; MWMS's own count is always the newest truth.
            if old is None or pattern.needle == "tasks to connect" or _score(finding, pattern) >= _score(*old):
                current[finding.kind] = (finding, pattern)
            elif finding.repeats > old[0].repeats:
                current[finding.kind] = (replace(old[0], repeats=finding.repeats), old[1])
            if in_stragglers:
                _set_stragglers(current, stragglers)
            open_kind, open_age = (finding.kind, 0) if finding.peer is None else (None, 0)
            continue
        if open_kind is not None:
            open_age += 1
            r = _REMOTE_TARGET.search(line)
            if r is not None:
                _attach_peer(current, open_kind, tf_task_name(r.group("t")))
                open_kind = None
            elif open_age >= PEER_LOOKAHEAD:
                open_kind = None
        if any(kind in current for kind in CLEARED_BY_PROGRESS) and _progress(line):
            for kind in CLEARED_BY_PROGRESS:
                current.pop(kind, None)
    if Kind.PEER_DIED in current:
        current.pop(Kind.STEP_CANCELLED, None)  # the death explains the cancelled step
    peer_wait = current.get(Kind.WAITING_FOR_PEER)
    if Kind.WAITING_FOR_MODEL in current and peer_wait and (peer_wait[0].peer or "").split(":")[0] != "ps":
        # Its session was up once: the CreateSession wait is the model wait's retry (a new
        # session per look), stuck on a finished worker. Why it retries is the news.
        del current[Kind.WAITING_FOR_PEER]
    return [current[k][0] for k in Kind if k in current]  # most important first


def _attach_peer(current: dict, kind: Kind, peer: str | None) -> None:
    """The peer named on a continuation line (`... from remote target /job:ps/...`) of a finding."""
    if peer is None or kind not in current or current[kind][0].peer is not None:
        return
    finding, pattern = current[kind]
    cause, fix = _peer_died_for(peer) if kind is Kind.PEER_DIED else (finding.cause, finding.fix)
    current[kind] = (replace(finding, peer=peer, cause=cause, fix=fix), pattern)


def _set_stragglers(current: dict, stragglers: list[str]) -> None:
    if Kind.MWMS_WAITING not in current or not stragglers:
        return
    finding, pattern = current[Kind.MWMS_WAITING]
    named = ", ".join(stragglers[:3]) + (f" and {len(stragglers) - 3} more" if len(stragglers) > 3 else "")
    cause = finding.cause.split(" (missing:")[0] + f" (missing: {named})"
    fix = f"start {named}, or check that its TF_CONFIG has the same cluster and its own task index"
    current[Kind.MWMS_WAITING] = (replace(finding, peer=stragglers[0], cause=cause, fix=fix), pattern)


def session_state(line: str, finding: Finding | None, previous: str = "") -> bool | None:
    """What a line (and the finding `match_line` gave it) says of its task's session: True it is
    up and the task moved on (TF says so, or the program prints), False it waits, None neither.
    The free text under a deprecation's `Instructions for updating:` is TF's, not the program's."""
    if finding is not None:
        return False if finding.kind in WAITS else None
    if previous.strip() == "Instructions for updating:":
        return None
    return _LOCAL_INIT_DONE in line or _progress(line) or None


def moved_on(task: str, lines: Iterable[str]) -> bool:
    """Whether a task's newest lines that tell show it past its session start, not waiting."""
    state, previous = None, ""
    for line in lines:
        now = session_state(line, match_line(task, line), previous)
        state, previous = state if now is None else now, line
    return bool(state)


def _progress(line: str) -> bool:
    """Does this (non-finding) line show the task moved on: program output, or TF saying so?"""
    if _TF_CHATTER.match(line):
        return _PROGRESS.search(line) is not None
    return not is_noise(line)
