"""tfctl.tf.diagnose against log lines captured from real TensorFlow 2.21 runs (tests/data/tf_logs).

Each capture's first line says how it was made (`# scenario: ...`); lines starting with `# ` are
the capture's header, everything else is TensorFlow's output verbatim.
"""

from __future__ import annotations

import calendar
import json
import time
from pathlib import Path

import pytest

from tfctl.engine.observed import TaskStatus, describe_end
from tfctl.runs.record import ProgressSpec
from tfctl.supervisor.protocol import TaskState
from tfctl.tf.diagnose import PATTERNS, Finding, Kind, diagnose, match_line, moved_on
from tfctl.tf.doctor import diagnose_run, finding_json
from tfctl.tf.explain import PeerInfo, explain, is_news
from tfctl.tf.log_lines import NOISE, is_noise, last_meaningful, tf_task_name

DATA = Path(__file__).resolve().parent / "data" / "tf_logs"
DEVICE_FILTERS = 'device_filters=["/job:ps", "/job:worker/task:%d"'


def load(name: str) -> list[str]:
    text = (DATA / name).read_text(encoding="utf-8")
    assert text.startswith("# scenario: "), f"{name} must start with a '# scenario:' line"
    return [line for line in text.splitlines() if not line.startswith("# ")]


def first(name: str, needle: str) -> str:
    """The first line of a capture that contains `needle` (so tests name real lines, not invent them)."""
    for line in load(name):
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r} in {name}")


def last(name: str, needle: str) -> str:
    return [line for line in load(name) if needle in line][-1]


def is_evidence_of(evidence: str, line: str) -> bool:
    """`evidence` is `line`, stripped and cut to 300 characters (ending in `...` when cut)."""
    line = line.strip()
    return evidence == line if len(line) <= 300 else (evidence.endswith("...") and line.startswith(evidence[:-3]))


# --------------------------------------------------------------------------- every capture -> findings

# file, task whose log it is, expected kinds (exactly, in order), peer of the first finding,
# words in its cause, words in its fix, a substring of its evidence.
CASES = [
    (
        "createsession_waiting_for_ps.log",
        "worker:0",
        ["waiting_for_peer"],
        "ps:0",
        ["waiting for ps:0", "CreateSession"],
        ["ps:0", "tfctl status"],
        "/job:ps/replica:0/task:0",
    ),
    (
        "createsession_no_device_filters.log",
        "worker:0",
        ["waiting_for_peer"],
        "worker:1",
        ["worker:1", "no device filters"],
        [DEVICE_FILTERS],
        "/job:worker/replica:0/task:1",
    ),
    (
        "ps_killed_worker0_default.log",
        "worker:0",
        ["step_cancelled"],
        None,
        ["cancelled", "ps dying", "hangs"],
        ["tfctl status", "GRPC_FAIL_FAST=true"],
        "Cancellation requested for RunGraph",
    ),
    (
        "ps_killed_worker1_default.log",
        "worker:1",
        ["step_cancelled"],
        None,
        ["cancelled", "hangs"],
        ["ps tasks"],
        "Local rendezvous send item cancelled",
    ),
    (
        "ps_killed_worker0_grpc_fail_fast.log",
        "worker:0",
        ["peer_died"],
        "ps:0",
        ["lost the connection to ps:0"],
        ["tfctl logs ps:0", "restart"],
        "CreateSession failed because worker /job:ps",
    ),
    (
        "port_in_use_second_server.log",
        "worker:0",
        ["port_in_use"],
        None,
        ["port 37373", "already listens"],
        ["ss -ltnp 'sport = :37373'", "tfctl -f ITS_FILE down", "tfctl down --all", "without a port"],
        "Failed to add port to server",
    ),
    (
        "port_in_use_plain_socket.log",
        "worker:0",
        ["port_in_use"],
        None,
        ["port 55359"],
        ["sport = :55359"],
        "'0.0.0.0:55359'",
    ),
    (
        "mwms_waiting_for_worker1.log",
        "worker:0",
        ["mwms_waiting"],
        "worker:1",
        ["1 of 2 tasks", "coordination service", "missing: worker:1"],
        ["start worker:1", "TF_CONFIG"],
        "Waiting for 1/2 tasks to connect",
    ),
    ("mwms_leader_missing_worker1_silent.log", "worker:1", [], None, [], [], None),
    (
        "mwms_peer_killed_survivor.log",
        "worker:0",
        ["peer_died"],
        "worker:1",
        ["lost the connection to worker:1"],
        ["tfctl logs worker:1"],
        "Collective ops is aborted by",
    ),
    (
        "nonchief_waiting_for_model.log",
        "worker:1",
        ["waiting_for_model"],
        None,
        ["chief to initialise the variables", "global_step, w", "30 s"],
        ["start the chief"],
        "Waiting for model to be ready",
    ),
    ("nonchief_waiting_for_model_default_verbosity.log", "worker:1", [], None, [], [], None),
    (
        "oom_eager_huge_tensor.log",
        "worker:0",
        ["oom"],
        None,
        ["out of memory", "[1073741824,1024] float", "4.4 TB", "CPU:0"],
        ["batch size", "more free memory"],
        "OOM when allocating tensor with shape[1073741824,1024]",
    ),
    (
        "oom_tf1_session_ulimit.log",
        "worker:0",
        ["oom"],
        None,
        ["[40000,40000] float", "6.4 GB"],
        ["batch size", "ulimit -v"],
        "OOM when allocating tensor with shape[40000,40000]",
    ),
    (
        "nan_loss_hook.log",
        "worker:0",
        ["nan_loss"],
        None,
        ["loss became NaN", "NanTensorHook"],
        ["learning rate", "clip", "enable_check_numerics"],
        "NaN loss during training",
    ),
    (
        "check_numerics_nan.log",
        "worker:0",
        ["nan_loss"],
        None,
        ["check_numerics 'loss check' found NaN values"],
        ["learning rate"],
        "Tensor had NaN values",
    ),
    (
        "bad_task_index.log",
        "worker:2",
        ["bad_cluster_spec"],
        None,
        ['no task 2 in job "worker"'],
        ["TF_CONFIG", "{task_index}"],
        'Task 2 was not defined in job "worker"',
    ),
    (
        "job_not_defined.log",
        "ps:0",
        ["bad_cluster_spec"],
        None,
        ['no job "ps"'],
        ["TF_CONFIG"],
        'Job "ps" was not defined in cluster',
    ),
    ("healthy_chief_worker0.log", "worker:0", [], None, [], [], None),
    ("healthy_worker1.log", "worker:1", [], None, [], [], None),
    (
        "hogwild_worker1_vars_on_own_task.log",
        "worker:1",
        ["waiting_for_model"],
        None,
        ["chief to initialise the variables", "w, global_step"],
        ["start the chief"],
        "Waiting for model to be ready",
    ),
    ("hogwild_chief_trains.log", "worker:0", [], None, [], [], None),
    (
        "supervisor_hogwild_worker1_never_initialised.log",
        "worker:1",
        ["waiting_for_model"],
        None,
        ["chief to initialise the variables", "w, global_step"],
        ["start the chief"],
        "ready: Variables not initialized: w, global_step",
    ),
    ("supervisor_hogwild_chief_bare_arrays.log", "worker:0", [], None, [], [], None),
    (
        "hogwild_worker1_unavailable_after_the_chief_left.log",
        "worker:1",
        ["peer_died"],
        "worker:0",
        ["lost the connection to worker:0"],
        ["see how worker:0 ended"],
        "CreateSession failed because worker /job:worker/replica:0/task:0 returned error: UNAVAILABLE",
    ),
    ("keras_fit_progress_bar.log", "worker:0", [], None, [], [], None),
]


def test_every_capture_has_a_case() -> None:
    files = {p.name for p in DATA.glob("*.log")}
    assert files == {c[0] for c in CASES}
    for name in files:
        assert load(name), f"{name} has no captured lines"


@pytest.mark.parametrize("name,task,kinds,peer,cause_words,fix_words,evidence", CASES, ids=[c[0] for c in CASES])
def test_capture(name, task, kinds, peer, cause_words, fix_words, evidence) -> None:
    lines = load(name)
    findings = diagnose(task, lines)
    assert [f.kind for f in findings] == [Kind(k) for k in kinds], [(f.kind, f.evidence) for f in findings]
    assert all(type(f.kind) is Kind for f in findings)
    if not kinds:
        return
    f = findings[0]
    assert f.task == task
    assert f.peer == peer
    for word in cause_words:
        assert word in f.cause, (word, f.cause)
    for word in fix_words:
        assert word in f.fix, (word, f.fix)
    assert evidence in f.evidence
    # Evidence is a real line of the capture (trimmed), and cause/fix are single lines.
    assert any(is_evidence_of(f.evidence, line) for line in lines)
    assert "\n" not in f.cause and "\n" not in f.fix


def test_diagnose_accepts_a_one_pass_iterator() -> None:
    lines = load("mwms_waiting_for_worker1.log")
    assert diagnose("worker:0", iter(lines)) == diagnose("worker:0", lines)


# ------------------------------------------------------------------------------------- single lines

# file, a substring picking the first real line containing it, expected kind (None: no finding), peer.
LINES = [
    ("createsession_waiting_for_ps.log", "CreateSession still waiting", "waiting_for_peer", "ps:0"),
    ("createsession_no_device_filters.log", "CreateSession still waiting", "waiting_for_peer", "worker:1"),
    ("ps_killed_worker0_grpc_fail_fast.log", "CreateSession failed because", "peer_died", "ps:0"),
    ("ps_killed_worker0_grpc_fail_fast.log", "Cleanup partition error: UNAVAILABLE", "peer_died", None),
    ("ps_killed_worker0_grpc_fail_fast.log", "Cancellation requested for RunGraph", "step_cancelled", None),
    ("mwms_peer_killed_survivor.log", "Aborting RingReduce with UNAVAILABLE", "peer_died", None),
    ("mwms_peer_killed_survivor.log", "Local rendezvous is aborting with status: UNAVAILABLE", "peer_died", None),
    ("mwms_peer_killed_survivor.log", "UnavailableError: Graph execution error", "peer_died", None),
    ("mwms_peer_killed_survivor.log", "Error received from peer", "peer_died", None),
    ("mwms_waiting_for_worker1.log", "Waiting for 1/2 tasks to connect", "mwms_waiting", None),
    ("mwms_waiting_for_worker1.log", "Example stragglers:", "mwms_waiting", None),
    ("nonchief_waiting_for_model.log", "Waiting for model to be ready", "waiting_for_model", None),
    ("port_in_use_second_server.log", "Failed to add port to server", "port_in_use", None),
    ("port_in_use_second_server.log", "UnknownError: Could not start gRPC server", "port_in_use", None),
    ("oom_eager_huge_tensor.log", "OP_REQUIRES failed", "oom", None),
    ("oom_eager_huge_tensor.log", "errors_impl.ResourceExhaustedError", "oom", None),
    ("oom_tf1_session_ulimit.log", "Local rendezvous is aborting with status: RESOURCE_EXHAUSTED", "oom", None),
    ("nan_loss_hook.log", "Model diverged with loss = NaN", "nan_loss", None),
    ("nan_loss_hook.log", "NanLossDuringTrainingError: NaN loss", "nan_loss", None),
    ("check_numerics_nan.log", "INVALID_ARGUMENT: loss check : Tensor had NaN values", "nan_loss", None),
    ("bad_task_index.log", "Task 2 was not defined", "bad_cluster_spec", None),
    # Not findings: ordinary progress, TF's own info, a straggler name alone, the end of a wait.
    ("mwms_peer_killed_survivor.log", "Waiting for 0/2 tasks to connect", None, None),
    ("mwms_waiting_for_worker1.log", "/job:worker/replica:0/task:1", None, None),
    ("healthy_chief_worker0.log", "Started server with target", None, None),
    ("healthy_chief_worker0.log", "Scanning workers for devices", None, None),
    ("healthy_chief_worker0.log", "final test accuracy", None, None),
    ("oom_tf1_session_ulimit.log", "exceeds 10% of free system memory", None, None),
    ("ps_killed_worker0_default.log", "ABORTED: Cleanup", None, None),
    ("ps_killed_worker0_grpc_fail_fast.log", "Additional GRPC error information", None, None),
]


@pytest.mark.parametrize("name,needle,kind,peer", LINES, ids=[f"{line[0]}:{line[1][:30]}" for line in LINES])
def test_match_line(name, needle, kind, peer) -> None:
    line = first(name, needle)
    f = match_line("worker:0", line)
    if kind is None:
        assert f is None, f
        return
    assert f is not None and f.kind is Kind(kind) and f.peer == peer, f
    assert f.task == "worker:0" and f.cause and f.fix and is_evidence_of(f.evidence, line)


def test_every_pattern_kind_is_a_known_kind() -> None:
    assert all(type(p.kind) is Kind for p in PATTERNS)
    assert set(Kind) - {p.kind for p in PATTERNS} == {Kind.UNKNOWN_FAILURE}


def test_a_kind_is_shown_and_written_as_its_plain_name() -> None:
    f = match_line("worker:0", first("oom_eager_huge_tensor.log", "OP_REQUIRES failed"))
    assert f is not None and f.kind is Kind.OOM
    shown = finding_json(f)
    assert shown is not None and type(shown["kind"]) is str and shown["kind"] == "oom"
    assert json.dumps(shown).startswith('{"kind": "oom", ')
    assert f"{f.kind}" == str(f.kind) == "oom"


def test_unknown_failure_is_the_exception_line() -> None:
    # The MWMS survivor's traceback ends in UnavailableError, which is known (peer_died), not unknown.
    assert Kind.UNKNOWN_FAILURE not in [f.kind for f in diagnose("worker:0", load("mwms_peer_killed_survivor.log"))]
    # A Python exception with no known pattern: the last line of the bad-index traceback, its
    # message cut off before the known text, stands for any unknown error.
    line = first("bad_task_index.log", "InternalError: Task 2")
    unknown = line.split(": Task 2")[0] + ": something else went wrong"
    f = match_line("worker:2", unknown)
    assert f is not None and f.kind is Kind.UNKNOWN_FAILURE
    assert "InternalError: something else went wrong" in f.cause and "tfctl logs --tail 60 worker:2" in f.fix
    others = [line for line in load("bad_task_index.log") if "was not defined" not in line]
    (u,) = diagnose("worker:2", others + [unknown])
    assert u.kind is Kind.UNKNOWN_FAILURE and u.evidence == unknown


def test_tf_task_names() -> None:
    assert tf_task_name(first("createsession_waiting_for_ps.log", "CreateSession still waiting")) == "ps:0"
    assert tf_task_name(first("oom_eager_huge_tensor.log", "OP_REQUIRES failed")) is None  # /job:localhost


def test_peer_on_the_next_line_is_attached() -> None:
    # "Cleanup partition error: UNAVAILABLE" names no task; the next line names the remote target.
    lines = load("ps_killed_worker0_grpc_fail_fast.log")
    i = next(i for i, line in enumerate(lines) if "Cleanup partition error: UNAVAILABLE" in line)
    (f,) = diagnose("worker:0", lines[: i + 2])
    assert f.kind is Kind.PEER_DIED and f.peer == "ps:0" and "ps:0" in f.cause
    (g,) = diagnose("worker:0", lines[: i + 1])
    assert g.kind is Kind.PEER_DIED and g.peer is None
    # Other threads' lines may come in between (here: a real Cleanup line of the same capture).
    other = first("ps_killed_worker0_grpc_fail_fast.log", "ABORTED: Cleanup")
    (h,) = diagnose("worker:0", lines[: i + 1] + [other, other] + lines[i + 1 : i + 2])
    assert h.peer == "ps:0"
    (k,) = diagnose("worker:0", lines[: i + 1] + [other] * 5 + lines[i + 1 : i + 2])
    assert k.peer is None  # too far away to be this error's peer


def test_newest_finding_per_kind_and_precise_beats_vague() -> None:
    lines = load("ps_killed_worker0_grpc_fail_fast.log")
    (f,) = diagnose("worker:0", lines)
    assert is_evidence_of(f.evidence, last("ps_killed_worker0_grpc_fail_fast.log", "CreateSession failed because"))
    # The port's line comes before the vaguer "Could not start gRPC server" ones and stays the evidence.
    (p,) = diagnose("worker:0", load("port_in_use_second_server.log"))
    assert "Failed to add port" in p.evidence


def test_a_wait_ends_when_the_task_makes_progress() -> None:
    waiting = load("createsession_waiting_for_ps.log")
    steps = [line for line in load("healthy_chief_worker0.log") if line.startswith("step ")]
    chatter = [
        first("healthy_chief_worker0.log", "Scanning workers for devices"),
        first("healthy_chief_worker0.log", "ABORTED: Cleanup"),
    ]
    assert [f.kind for f in diagnose("worker:0", waiting + chatter)] == [Kind.WAITING_FOR_PEER]
    assert diagnose("worker:0", waiting + steps[:1]) == []
    # MWMS: "Waiting for 1/2" then "Waiting for 0/2": over (the survivor capture, cut before the kill).
    survivor = load("mwms_peer_killed_survivor.log")
    before_kill = survivor[: next(i for i, line in enumerate(survivor) if "UNAVAILABLE" in line)]
    assert any("Waiting for 1/2" in line for line in before_kill)
    assert diagnose("worker:0", before_kill) == []
    upto_wait = before_kill[: next(i for i, line in enumerate(before_kill) if "Waiting for 0/2" in line)]
    assert [f.kind for f in diagnose("worker:0", upto_wait)] == [Kind.MWMS_WAITING]
    # TF's own "Waiting for 0/2" (and the barrier that follows) end it, before any program output.
    tf_only = before_kill[: next(i for i, line in enumerate(before_kill) if line.startswith("strategy ready"))]
    assert diagnose("worker:0", tf_only) == []


# ------------------------------------------------------------------------------------------- noise

NOISY = [
    ("createsession_waiting_for_ps.log", "failed call to cuInit"),
    ("createsession_waiting_for_ps.log", "Could not find cuda drivers"),
    ("createsession_waiting_for_ps.log", "WARNING: All log messages before absl::InitializeLog()"),
    ("createsession_waiting_for_ps.log", "This TensorFlow binary is optimized"),
    ("createsession_waiting_for_ps.log", "To enable the following instructions"),
    ("createsession_waiting_for_ps.log", "disable_resource_variables"),
    ("createsession_waiting_for_ps.log", "Instructions for updating:"),
    ("createsession_waiting_for_ps.log", "non-resource variables are not supported"),
    ("healthy_chief_worker0.log", "Local rendezvous is aborting with status: ABORTED: Cleanup"),
    ("healthy_chief_worker0.log", "MLIR V1 optimization pass is not enabled"),
]
MEANINGFUL = [
    ("mwms_peer_killed_survivor.log", "Local rendezvous is aborting with status: UNAVAILABLE"),
    ("oom_tf1_session_ulimit.log", "Local rendezvous is aborting with status: RESOURCE_EXHAUSTED"),
    ("ps_killed_worker0_grpc_fail_fast.log", "Local rendezvous is aborting with status: ABORTED: Stopping"),
    ("healthy_chief_worker0.log", "Started server with target"),
    ("healthy_chief_worker0.log", "Scanning workers for devices"),
    ("createsession_waiting_for_ps.log", "CreateSession still waiting"),
]


@pytest.mark.parametrize("name,needle", NOISY)
def test_noise(name, needle) -> None:
    assert is_noise(first(name, needle))


@pytest.mark.parametrize("name,needle", MEANINGFUL)
def test_not_noise(name, needle) -> None:
    assert not is_noise(first(name, needle))


def test_noise_alone_gives_no_finding_and_no_last_line() -> None:
    lines = load("createsession_waiting_for_ps.log")
    before_server = lines[: next(i for i, line in enumerate(lines) if "Started server" in line)]
    assert all(
        is_noise(line) or line.strip() == "non-resource variables are not supported in the long term"
        for line in before_server
    )
    assert diagnose("worker:0", before_server) == []
    assert last_meaningful(before_server) is None
    upto_server = lines[: len(before_server) + 1]
    assert "Started server with target" in (last_meaningful(upto_server) or "")


@pytest.mark.parametrize(
    "name,expected",
    [
        ("healthy_chief_worker0.log", "final test accuracy 0.9666"),
        ("oom_tf1_session_ulimit.log", "OOM when allocating tensor with shape[40000,40000]"),  # not the frames after it
        ("mwms_peer_killed_survivor.log", "Collective ops is aborted by: recvmsg:Connection reset by peer"),
        ("bad_task_index.log", 'InternalError: Task 2 was not defined in job "worker"'),
        ("mwms_leader_missing_worker1_silent.log", "Started server with target: grpc://localhost:42203"),
        ("nonchief_waiting_for_model_default_verbosity.log", "Initializing CoordinationService"),
    ],
)
def test_last_meaningful(name, expected) -> None:
    assert expected in (last_meaningful(load(name)) or "")


def test_last_meaningful_skips_the_line_after_instructions_for_updating() -> None:
    lines = load("createsession_waiting_for_ps.log")
    i = next(i for i, line in enumerate(lines) if line.startswith("Instructions for updating:"))
    # Make the free-text line look like anything: it is skipped because of its position.
    block = lines[: i + 1] + ["data: " + lines[i + 1]]
    assert last_meaningful(block) is None
    assert (last_meaningful(block + [first("healthy_chief_worker0.log", "step ")]) or "").startswith("step ")


def test_noise_list_has_no_pattern_needle() -> None:
    # A noise entry that contained a pattern's needle would hide real findings.
    for n in NOISE:
        for p in PATTERNS:
            assert p.needle not in n


# -------------------------------------------------------------------------------------------- explain

T_END = calendar.timegm((2026, 11, 22, 18, 44, 3))


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def cluster(**states: PeerInfo) -> dict[str, PeerInfo]:
    base = {
        "ps:0": PeerInfo("ps:0", "hostA", 2222, TaskState.RUNNING, listening=True),
        "worker:0": PeerInfo("worker:0", "hostB", 2223, TaskState.RUNNING, listening=True),
        "worker:1": PeerInfo("worker:1", "hostC", 2224, TaskState.RUNNING, listening=True),
    }
    base.update(states)
    return base


def never(src: str, address: str) -> bool | None:
    raise AssertionError(f"reachability must not be probed here ({src} -> {address})")


def waiting_for_ps() -> Finding:
    (f,) = diagnose("worker:0", load("createsession_waiting_for_ps.log"))
    return f


def test_explain_peer_not_in_cluster() -> None:
    peers = cluster()
    del peers["ps:0"]
    e = explain(waiting_for_ps(), peers, never)
    assert "ps:0, which is not a task of this cluster" in e.cause and "worker:0, worker:1" in e.cause
    assert "TF_CONFIG" in e.fix and e.evidence == waiting_for_ps().evidence


def test_explain_peer_pending() -> None:
    e = explain(waiting_for_ps(), cluster(**{"ps:0": PeerInfo("ps:0", "hostA", 2222, TaskState.PENDING)}), never)
    assert "ps:0 (hostA:2222), which has never started (pending)" in e.cause


def test_explain_peer_exited_with_code_1_at_time(utc) -> None:
    peers = cluster(**{"ps:0": PeerInfo("ps:0", "hostA", 2222, TaskState.FAILED, exit_code=1, ended_at=T_END)})
    e = explain(waiting_for_ps(), peers, never)
    assert "ps:0 exited with code 1 at 18:44:03" in e.cause
    assert "tfctl logs ps:0" in e.fix and "restart" in e.fix


def test_explain_peer_killed_by_signal(utc) -> None:
    peers = cluster(**{"ps:0": PeerInfo("ps:0", "hostA", 2222, TaskState.FAILED, signal=9, ended_at=T_END + 60)})
    e = explain(waiting_for_ps(), peers, never)
    assert "ps:0 was killed by signal 9 (SIGKILL" in e.cause and "out-of-memory killer" in e.cause
    assert "at 18:45:03" in e.cause


def test_explain_peer_running_not_listening() -> None:
    peers = cluster(**{"ps:0": PeerInfo("ps:0", "hostA", 2222, TaskState.RUNNING, listening=False)})
    e = explain(waiting_for_ps(), peers, never)
    assert "running but does not listen on hostA:2222 yet" in e.cause
    assert "Started server with target" in e.fix and "2222" in e.fix


def test_explain_peer_running_unreachable() -> None:
    asked = []

    def reachable(src: str, address: str) -> bool | None:
        asked.append((src, address))
        return False

    e = explain(waiting_for_ps(), cluster(), reachable)
    assert asked == [("hostB", "hostA:2222")]
    assert "NOT reachable from hostB" in e.cause and "hostA:2222" in e.cause
    assert "nc -vz hostA 2222" in e.fix and "firewall" in e.cause


def test_explain_peer_running_reachable_means_device_filters() -> None:
    e = explain(waiting_for_ps(), cluster(), lambda src, address: True)
    assert "reachable at hostA:2222 from hostB" in e.cause and "device filters" in e.cause
    assert DEVICE_FILTERS in e.fix


def test_explain_peer_reachability_unknown() -> None:
    e = explain(waiting_for_ps(), cluster(), lambda src, address: None)
    assert "unknown" in e.cause and "nc -vz hostA 2222" in e.fix


def test_explain_worker_waiting_on_worker(utc) -> None:
    (f,) = diagnose("worker:0", load("createsession_no_device_filters.log"))
    pending = explain(f, cluster(**{"worker:1": PeerInfo("worker:1", "hostC", 2224, TaskState.PENDING)}), never)
    assert "never started" in pending.cause and "device filters" in pending.cause and DEVICE_FILTERS in pending.fix
    done = explain(
        f,
        cluster(**{"worker:1": PeerInfo("worker:1", "hostC", 2224, TaskState.SUCCEEDED, exit_code=0, ended_at=T_END)}),
        never,
    )
    assert "but worker:1 exited with code 0 at 18:44:03" in done.cause and DEVICE_FILTERS in done.fix


def waiting_for_model() -> Finding:
    (f,) = diagnose("worker:1", load("nonchief_waiting_for_model.log"))
    return f


@pytest.mark.parametrize(
    "chief,words",
    [
        (PeerInfo("worker:0", "hostB", 2223, TaskState.PENDING), ["has not started yet"]),
        (
            PeerInfo("worker:0", "hostB", 2223, TaskState.FAILED, exit_code=1, ended_at=T_END),
            ["worker:0 exited with code 1 at 18:44:03", "waits forever"],
        ),
        (
            PeerInfo("worker:0", "hostB", 2223, TaskState.SUCCEEDED, exit_code=0, ended_at=T_END),
            ["worker:0 exited with code 0 at 18:44:03, yet", "waits forever"],
        ),
        (PeerInfo("worker:0", "hostB", 2223, TaskState.RUNNING, listening=True), ["running but has not initialised"]),
    ],
)
def test_explain_waiting_for_model(utc, chief, words) -> None:
    e = explain(waiting_for_model(), cluster(**{"worker:0": chief}), never)
    assert e.peer == "worker:0"
    for w in words:
        assert w in e.cause, (w, e.cause)


class CapturedCluster:
    """The run of the Hogwild captures, as diagnose_run sees it: each task's tail is its capture."""

    class record:
        progress = ProgressSpec()

    def tails(self, names, count):
        files = {"worker:0": "hogwild_chief_trains.log", "worker:1": "hogwild_worker1_vars_on_own_task.log"}
        return {name: load(files[name])[-count:] for name in names if name in files}

    def reachable(self, source, address):
        return True


def test_a_worker_whose_variables_live_on_its_own_task_gets_that_advice_while_the_chief_trains() -> None:
    statuses = [
        TaskStatus("ps:0", "ps", 0, "localhost", 25222, TaskState.RUNNING, listening=True),
        TaskStatus("worker:0", "worker", 0, "localhost", 25223, TaskState.RUNNING, listening=True),
        TaskStatus("worker:1", "worker", 1, "localhost", 25224, TaskState.RUNNING, listening=True),
    ]
    found = diagnose_run(CapturedCluster(), statuses).findings["worker:1"]  # type: ignore[arg-type]
    assert found.kind is Kind.WAITING_FOR_MODEL and found.peer == "worker:0"
    assert "the chief worker:0 trains" in found.cause and "this worker's own task" in found.cause
    assert "replica_device_setter" in found.fix
    # A chief that is not training yet gets the other advice: read its log.
    quiet = explain(
        waiting_for_model(), cluster(**{"worker:0": PeerInfo("worker:0", "h", 1, TaskState.RUNNING)}), never
    )
    assert "has not initialised the variables yet" in quiet.cause


def test_explain_waiting_for_model_prefers_chief_job_and_catches_a_non_chief_chief() -> None:
    peers = cluster(**{"chief:0": PeerInfo("chief:0", "hostD", 2225, TaskState.PENDING)})
    assert explain(waiting_for_model(), peers, never).peer == "chief:0"
    (f,) = diagnose("worker:0", load("nonchief_waiting_for_model.log"))  # worker:0 is the chief here
    e = explain(f, cluster(), never)
    assert "runs as a non-chief" in e.cause and "is_chief" in e.fix


def test_explain_mwms_straggler() -> None:
    (f,) = diagnose("worker:0", load("mwms_waiting_for_worker1.log"))
    e = explain(f, cluster(**{"worker:1": PeerInfo("worker:1", "hostC", 2224, TaskState.PENDING)}), never)
    assert "MultiWorkerMirroredStrategy waits for worker:1" in e.cause and "never started" in e.cause
    r = explain(f, cluster(), lambda src, address: True)
    assert "TF_CONFIG" in r.cause and "device_filters" not in r.fix


def test_explain_step_cancelled_finds_the_dead_ps(utc) -> None:
    (f,) = diagnose("worker:0", load("ps_killed_worker0_default.log"))
    peers = cluster(**{"ps:0": PeerInfo("ps:0", "hostA", 2222, TaskState.FAILED, signal=9, ended_at=T_END)})
    e = explain(f, peers, never)
    assert e.peer == "ps:0" and "ps:0 was killed by signal 9" in e.cause and "hangs" in e.cause
    assert explain(f, cluster(), never) == f  # nobody ended: nothing to add


def test_explain_peer_died(utc) -> None:
    (f,) = diagnose("worker:0", load("ps_killed_worker0_grpc_fail_fast.log"))
    peers = cluster(**{"ps:0": PeerInfo("ps:0", "hostA", 2222, TaskState.FAILED, signal=9, ended_at=T_END)})
    assert (
        explain(f, peers, never).cause == "lost the connection to ps:0: ps:0 was killed by signal 9 "
        "(SIGKILL, maybe by the kernel's out-of-memory killer) at 18:44:03"
    )


def test_a_connection_lost_to_a_peer_that_finished_well_is_no_news(utc) -> None:
    """A TF1 synchronous job whose worker 1 ends (exit 0) before worker 0: worker 0's gRPC logs
    the dropped connection, which is how the job ends, not a lost peer to report."""
    (f,) = diagnose("worker:0", load("mwms_peer_killed_survivor.log"))
    done = cluster(
        **{"worker:1": PeerInfo("worker:1", "hostB", 2222, TaskState.SUCCEEDED, exit_code=0, ended_at=T_END)}
    )
    killed = cluster(**{"worker:1": PeerInfo("worker:1", "hostB", 2222, TaskState.FAILED, signal=9, ended_at=T_END)})
    assert f.peer == "worker:1" and not is_news(f, done)
    assert is_news(f, killed) and is_news(f, cluster())  # a peer that failed, or one tfctl cannot tell


def test_explain_leaves_other_kinds_alone() -> None:
    (f,) = diagnose("worker:0", load("oom_tf1_session_ulimit.log"))
    assert explain(f, cluster(), never) is f


def test_explain_finished_ps_is_not_a_device_filter_problem(utc) -> None:
    peers = cluster(**{"ps:0": PeerInfo("ps:0", "hostA", 2222, TaskState.SUCCEEDED, exit_code=0, ended_at=T_END)})
    e = explain(waiting_for_ps(), peers, never)
    assert "but ps:0 exited with code 0 at 18:44:03" in e.cause
    assert "device_filters" not in e.fix and "tfctl logs ps:0" in e.fix


def test_peer_info() -> None:
    assert PeerInfo("ps:0", "::1", 2222).address == "[::1]:2222"
    s = TaskStatus("ps:0", "ps", 0, "hostA", 2222, TaskState.FAILED, pid=7, signal=9, error="boom")
    p = PeerInfo.from_status(s, ended_at=T_END)
    assert (p.task, p.address, p.state, p.signal, p.ended_at, p.listening, p.error) == (
        "ps:0",
        "hostA:2222",
        TaskState.FAILED,
        9,
        T_END,
        False,
        "boom",
    )


def test_describe_end(utc) -> None:
    assert describe_end(TaskState.LOST, ended_at=T_END).endswith("no exit code was recorded)")
    assert describe_end(TaskState.FAILED, exit_code=3) == "exited with code 3"
    assert describe_end(TaskState.SUCCEEDED, exit_code=0, ended_at=T_END) == "exited with code 0 at 18:44:03"
    assert describe_end(TaskState.STOPPED, exit_code=-15) == "was stopped (tfctl down)"
    assert describe_end(TaskState.FAILED, signal=6) == "was killed by signal 6 (SIGABRT)"
    assert describe_end(TaskState.FAILED, error="could not start: no such file") == "could not start: no such file"


# ------------------------------------------------------------------------------------- performance


class CountingLines(list):
    """A list that counts item reads, to show how much of a long log a function looks at."""

    reads = 0

    def __getitem__(self, i):
        CountingLines.reads += 1
        return super().__getitem__(i)


def test_last_meaningful_reads_from_the_end_only() -> None:
    lines = CountingLines(load("healthy_chief_worker0.log") * 5000)
    CountingLines.reads = 0
    assert (last_meaningful(lines) or "").startswith("final test accuracy")
    assert CountingLines.reads < 10


def test_scanning_is_linear() -> None:
    lines = []
    for p in sorted(DATA.glob("*.log")):
        lines += load(p.name)

    def best(n: int) -> float:
        chunk = (lines * (n // len(lines) + 1))[:n]
        times = []
        for _ in range(3):
            t = time.perf_counter()
            diagnose("worker:0", chunk)
            times.append(time.perf_counter() - t)
        return min(times)

    small, large = best(5_000), best(50_000)
    # 10x the lines: linear costs ~10x; quadratic would cost ~100x. Generous for a busy machine.
    assert large < 30 * small, (small, large)


# --- a worker that never gets past waiting (tf.train.Supervisor Hogwild captures) ----------------

W1 = "supervisor_hogwild_worker1_never_initialised.log"
W0 = "supervisor_hogwild_chief_bare_arrays.log"


def test_a_repeated_model_wait_counts_its_repeats_and_the_task_has_not_moved_on() -> None:
    lines = load(W1)
    (f,) = diagnose("worker:1", lines)
    assert f.repeats == sum("Waiting for model to be ready" in line for line in lines) > 1
    # Supervisor runs local init before each look: its "Done running local_init_op" is no way out.
    assert any("Done running local_init_op" in line for line in lines) and not moved_on("worker:1", lines)
    assert moved_on("worker:0", load(W0))  # TF's "Starting queue runners", then bare arrays
    assert not moved_on("worker:0", load(W0)[:12])  # still starting


def test_a_wait_ends_when_tf_says_the_session_is_up() -> None:
    waited = load(W1)
    assert diagnose("worker:1", [*waited, "INFO:tensorflow:Starting queue runners."]) == []


def test_a_model_wait_retried_on_a_finished_worker_is_still_a_model_wait() -> None:
    """success_policy all_workers: the chief ends, worker 1's next session waits for it; the
    model wait, not device filters, says why worker 1 never trains."""
    retry = next(line for line in load("createsession_no_device_filters.log") if "CreateSession still" in line)
    retry = retry.replace("/job:worker/replica:0/task:1", "/job:worker/replica:0/task:0")
    assert [f.kind for f in diagnose("worker:1", [*load(W1), retry])] == [Kind.WAITING_FOR_MODEL]
    ps_retry = retry.replace("/job:worker/", "/job:ps/")  # a ps holds variables: that wait stays news
    assert [f.kind for f in diagnose("worker:1", [*load(W1), ps_retry])][0] is Kind.WAITING_FOR_PEER


class SupervisorCluster(CapturedCluster):
    def tails(self, names, count):
        files = {"worker:0": W0, "worker:1": W1}
        return {name: load(files[name])[-count:] for name in names if name in files}


def test_an_ended_run_names_the_task_that_never_got_past_waiting(utc) -> None:
    statuses = [
        TaskStatus("worker:0", "worker", 0, "localhost", 1, TaskState.SUCCEEDED, exit_code=0, ended_at=T_END),
        TaskStatus("worker:1", "worker", 1, "localhost", 2, TaskState.STOPPED, ended_at=T_END),
    ]
    found = diagnose_run(SupervisorCluster(), statuses)  # type: ignore[arg-type]
    assert list(found.never_ready) == ["worker:1"] and found.findings == {}
    f = found.never_ready["worker:1"]
    assert f.kind is Kind.WAITING_FOR_MODEL and f.peer == "worker:0"
    assert "the chief worker:0 trained, then worker:0 exited with code 0 at 18:44:03" in f.cause
    assert "this worker's own task" in f.cause and "replica_device_setter" in f.fix
    # Live, with bare arrays for progress, TF's own lines still tell that the chief moved on.
    statuses[0] = TaskStatus("worker:0", "worker", 0, "localhost", 1, TaskState.RUNNING, listening=True)
    statuses[1] = TaskStatus("worker:1", "worker", 1, "localhost", 2, TaskState.RUNNING, listening=True)
    live = diagnose_run(SupervisorCluster(), statuses).findings["worker:1"]  # type: ignore[arg-type]
    assert "the chief worker:0 trains" in live.cause
