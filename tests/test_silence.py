"""The silent task (`tf.silence`), as tables: what each task printed in, who is named and why out."""

from __future__ import annotations

import pytest

from tfctl.supervisor.protocol import TaskState
from tfctl.tf.silence import OTHER_FIX, SESSION_FIX, Output, likely_wait, silences

T = 1_790_000_000.0
RUNNING, STOPPED, SUCCEEDED = TaskState.RUNNING, TaskState.STOPPED, TaskState.SUCCEEDED
SCANNING = "I0000 master.cc:243] Scanning workers for devices: 3 total workers"


def out(task: str, state: TaskState = STOPPED, **facts: object) -> Output:
    return Output(task, task.split(":")[0], state, **facts)  # type: ignore[arg-type]


# (tasks, now, who is named -> the peer and what it did, or nothing)
CASES = {
    "the Hogwild run of issue 33: bare arrays, worker 1 silent after its session came up": (
        [
            out("ps:0", last_at=T + 2, lines=3),
            out("worker:0", SUCCEEDED, last_at=T + 28, lines=5000, ended_at=T + 28),
            out("worker:1", last_at=T + 7, lines=31, last_line=SCANNING, ended_at=T + 29),
        ],
        T + 30,
        {"worker:1": ("worker:0", "printed 5000 lines", 21)},
    ),
    "by steps: worker 1 logs none while worker 0 reaches step 1200": (
        [out("worker:0", RUNNING, step=1200, last_at=T + 59), out("worker:1", RUNNING, last_at=T + 5)],
        T + 60,
        {"worker:1": ("worker:0", "reached step 1200", 55)},
    ),
    "quiet for less than the threshold is no silence": (
        [out("worker:0", RUNNING, step=1200, last_at=T + 59), out("worker:1", RUNNING, last_at=T + 55)],
        T + 60,
        {},
    ),
    "a peer still printing, but both print about as much: a worker that finished its share": (
        [out("worker:0", RUNNING, last_at=T + 59, lines=900), out("worker:1", STOPPED, last_at=T + 5, lines=800)],
        T + 60,
        {},
    ),
    "a task that exited 0 by itself finished its work": (
        [out("worker:0", RUNNING, step=10, last_at=T + 59), out("worker:1", SUCCEEDED, last_at=T + 5, ended_at=T + 5)],
        T + 60,
        {},
    ),
    "ParameterServerStrategy: its workers print nothing while the chief steps, as they should": (
        [out("chief:0", RUNNING, step=400, last_at=T + 59), out("worker:0", RUNNING, last_at=T + 3)],
        T + 60,
        {},
    ),
    "a ps is never a trainer": (
        [out("worker:0", RUNNING, step=400, last_at=T + 59), out("ps:0", RUNNING, last_at=T + 1)],
        T + 60,
        {},
    ),
    "every task silent: nobody went on, nobody is named here (the hang or stall rules are for that)": (
        [out("worker:0", RUNNING, last_at=T + 5), out("worker:1", RUNNING, last_at=T + 5)],
        T + 600,
        {},
    ),
    "a failed task has its own diagnosis": (
        [out("worker:0", RUNNING, step=5, last_at=T + 59), out("worker:1", TaskState.FAILED, last_at=T + 1)],
        T + 60,
        {},
    ),
    "live, lines not counted: a peer that went on printing": (
        [out("worker:0", RUNNING, last_at=T + 200), out("worker:1", RUNNING, last_at=T + 10, last_line=SCANNING)],
        T + 200,
        {"worker:1": ("worker:0", "went on printing", 190)},
    ),
}


@pytest.mark.parametrize("tasks, now, named", list(CASES.values()), ids=list(CASES))
def test_who_is_named_silent(tasks: list[Output], now: float, named: dict) -> None:
    found = silences(tasks, now)
    assert {t: (s.peer, s.peer_did, round(s.quiet)) for t, s in found.items()} == named


def test_the_sentence_names_the_silence_its_last_line_and_the_peer() -> None:
    (silence,) = silences(
        CASES["the Hogwild run of issue 33: bare arrays, worker 1 silent after its session came up"][0], T + 30
    ).values()
    assert silence.text() == (
        f"worker:1 printed nothing for 21 s after `{SCANNING}` while worker:0 printed 5000 lines: it never trained"
    )
    assert silence.text(ended=False).endswith("it is not training")
    assert "Waiting for model to be ready" in silence.cause and "INFO" in silence.cause
    assert silence.fix == SESSION_FIX and "set_verbosity" in silence.fix and "replica_device_setter" in silence.fix


@pytest.mark.parametrize(
    "last_line, fix",
    [
        (SCANNING, SESSION_FIX),
        ("I0000 grpc_server_lib.cc:467] Started server with target: grpc://localhost:2223", SESSION_FIX),
        ("INFO:tensorflow:Running local_init_op.", SESSION_FIX),
        (  # TF 2.21's last line before a Supervisor's silent wait
            "I0000 00:00:1795824706.042538   23212 coordination_service.cc:221] Initializing CoordinationService",
            SESSION_FIX,
        ),
        ("loading shards from /data", OTHER_FIX),
        ("", OTHER_FIX),
    ],
)
def test_what_tf_most_likely_waits_for_follows_the_last_line(last_line: str, fix: str) -> None:
    assert likely_wait(last_line)[1] == fix
