"""Progress from task output: the host's search (`supervisor/marks.py`, `supervisor/timeline.py`)
and its meaning (`tf/progress.py`), against logs of real TF runs and lines at known times."""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import pytest

from tests.conftest import fake, free_ports, tfctl
from tfctl.supervisor.marks import recent_marks
from tfctl.supervisor.protocol import Mark, TaskState
from tfctl.supervisor.timeline import Timeline, TimeNotes, times_path
from tfctl.tf.progress import Progress, ProgressReader, flags
from tfctl.tf.results import metrics

DATA = Path(__file__).resolve().parent / "data" / "tf_logs"
NOW = 1_800_000_000.0


def write_log(tmp_path: Path, chunks: list[tuple[float, bytes]]) -> str:
    """An output.log written in `chunks`, each noted at its time as a task's monitor would."""
    log = tmp_path / "output.log"
    size = 0
    with open(log, "wb") as f, open(times_path(str(log)), "wb") as times:
        for when, data in chunks:
            f.write(data)
            size += len(data)
            times.write(struct.pack("<dQ", when, size))
    return str(log)


def progress_of(log: str, reader: ProgressReader | None = None, now: float = NOW) -> Progress:
    reader = reader or ProgressReader()
    marks = recent_marks(log, reader.rule(), now)
    return reader.read(marks, now, uptime=7200.0, running=True)  # running since before its log's lines


def real_log(tmp_path: Path, name: str) -> str:
    """A captured log as if written in one go, a minute ago."""
    return write_log(tmp_path, [(NOW - 60, (DATA / name).read_bytes())])


def test_the_templates_step_lines_give_the_last_step_and_glog_and_totals_are_not_steps(tmp_path: Path) -> None:
    log = real_log(tmp_path, "healthy_chief_worker0.log")
    # ends with "final test accuracy ... after 601 global steps": a total, not a step line
    assert progress_of(log).step == 546


def test_a_keras_progress_bar_redrawn_in_place_counts_epochs_and_steps(tmp_path: Path) -> None:
    log = real_log(tmp_path, "keras_fit_progress_bar.log")
    assert progress_of(log).step == 2 * 500 + 500


def test_tf_log_lines_are_never_progress(tmp_path: Path) -> None:
    glog = b"I0000 00:00:1795373794.066835   20884 master.cc:243] step 5 of the scan\n"
    log = write_log(tmp_path, [(NOW - 5, b"step 3 loss 0.1\n"), (NOW - 1, glog)])
    assert progress_of(log).step == 3


def test_steps_per_second_comes_from_when_the_lines_were_written(tmp_path: Path) -> None:
    # 10 steps a second for 50 s, noted once a second.
    chunks = [(NOW - 50 + s, b"".join(b"step %d loss 0.5\n" % (s * 10 + i) for i in range(10))) for s in range(50)]
    p = progress_of(write_log(tmp_path, chunks))
    assert p.step == 499
    assert p.steps_per_sec == pytest.approx(10, rel=0.05)
    assert p.quiet_for == pytest.approx(1, abs=0.01)


def test_only_steps_since_a_restart_make_the_rate(tmp_path: Path) -> None:
    before = [(NOW - 40 + s, b"step %d\n" % (1000 + s)) for s in range(10)]
    after = [(NOW - 20 + s, b"step %d\n" % (s * 2)) for s in range(20)]
    p = progress_of(write_log(tmp_path, before + after))
    assert p.step == 38
    assert p.steps_per_sec == pytest.approx(2, rel=0.05)


def test_a_rate_the_program_logs_is_taken_as_it_is(tmp_path: Path) -> None:
    lines = b"INFO:tensorflow:loss = 0.25, step = 1200 (0.4 sec)\nINFO:tensorflow:global_step/sec: 31.4\n"
    p = progress_of(write_log(tmp_path, [(NOW - 3, lines)]))
    assert (p.step, p.steps_per_sec) == (1200, 31.4)


@pytest.mark.parametrize(
    "line, step",
    [
        (b"Step #77 done", 77),
        (b"global step 88, loss 1", 88),
        (b"[train] step: 99", 99),
        (b"iteration 5 steps 3", None),
    ],
)
def test_common_shapes(tmp_path: Path, line: bytes, step: int | None) -> None:
    assert progress_of(write_log(tmp_path, [(NOW - 1, line + b"\n")])).step == step


@pytest.mark.parametrize(
    "line, epoch",
    [(b"Finished epoch 3", 3), (b"epoch: 4 loss 0.2", 4), (b"Epoch 2/5", 2), (b"EPOCH #7", 7), (b"epochs 9", None)],
)
def test_epochs_are_progress_of_their_own(tmp_path: Path, line: bytes, epoch: int | None) -> None:
    p = progress_of(write_log(tmp_path, [(NOW - 2, b"Finished epoch 1\n" if epoch else b""), (NOW - 1, line + b"\n")]))
    assert p.epoch == epoch and p.step is None


def test_a_user_regex_replaces_the_built_in_shapes(tmp_path: Path) -> None:
    log = write_log(tmp_path, [(NOW - 2, b"iter 41 step 7\n"), (NOW - 1, b"iter 42 step 8\n")])
    assert progress_of(log, ProgressReader(r"iter (?P<step>\d+)")).step == 42


def test_a_task_without_progress_in_the_window_has_rate_zero(tmp_path: Path) -> None:
    log = write_log(tmp_path, [(NOW - 500, b"step 1\n"), (NOW - 400, b"step 2\n"), (NOW - 10, b"waiting\n")])
    p = progress_of(log)
    assert (p.step, p.steps_per_sec) == (2, 0.0)
    assert p.quiet_for == pytest.approx(400, abs=1)


def test_a_task_restarted_since_its_last_step_is_quiet_only_since_its_restart(tmp_path: Path) -> None:
    """Its log goes on across restarts: the steps before one are not its silence since."""
    log = write_log(tmp_path, [(NOW - 500, b"step 1\n"), (NOW - 400, b"step 2\n")])
    reader = ProgressReader()
    p = reader.read(recent_marks(log, reader.rule(), NOW), NOW, uptime=30.0, running=True)
    assert p.quiet_for == pytest.approx(30)


def test_a_long_chatty_log_is_read_only_as_far_as_needed(tmp_path: Path) -> None:
    noise = b"x" * 120 + b"\n"
    chunks = [(NOW - 3600 + s, b"step %d\n" % s + noise * 100) for s in range(3600)]  # 43 MB
    reader = ProgressReader()
    marks = recent_marks(write_log(tmp_path, chunks), reader.rule(), NOW)
    assert 2 <= len(marks) <= 200
    p = reader.read(marks, NOW, 3600.0, True)
    assert p.step == 3599
    assert p.steps_per_sec == pytest.approx(1, rel=0.05)


def test_timeline_dates_offsets_and_finds_offsets_of_times(tmp_path: Path) -> None:
    log = write_log(tmp_path, [(100.0, b"a\n"), (101.0, b"bb\n"), (102.0, b"ccc\n")])
    with Timeline(log) as timeline:
        assert [timeline.time_of(o) for o in (0, 1, 2, 4, 5, 8)] == [100.0, 100.0, 101.0, 101.0, 102.0, 102.0]
        assert [timeline.offset_at(t) for t in (99.0, 100.0, 100.5, 101.0, 200.0)] == [0, 2, 2, 5, 9]


def test_the_monitors_notes_follow_the_logs_growth(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_bytes(b"one\n")
    notes = TimeNotes(str(log))
    notes.note()
    notes.note()  # no growth: no record
    with open(log, "ab") as f:
        f.write(b"two\n")
    notes.note()
    assert Path(times_path(str(log))).stat().st_size == 2 * 16
    assert TimeNotes(str(log)).last_size == 8  # a new monitor goes on from there


def test_flags_stalled_straggler_restarting() -> None:
    tasks = [
        ("ps:0", "ps", TaskState.RUNNING),
        ("worker:0", "worker", TaskState.RUNNING),
        ("worker:1", "worker", TaskState.RUNNING),
        ("worker:2", "worker", TaskState.RUNNING),
        ("worker:3", "worker", TaskState.RESTARTING),
        ("worker:4", "worker", TaskState.RUNNING),
    ]
    progress = {
        "ps:0": Progress(None, None, 900.0),  # never steps, nor does its job: not stalled
        "worker:0": Progress(500, 10.0, 1.0),
        "worker:1": Progress(480, 9.0, 1.0),
        "worker:2": Progress(100, 2.0, 1.0),
        "worker:3": Progress(300, None, None),
        "worker:4": Progress(None, None, 200.0),  # its job steps; it never did, for 200 s
    }
    found = flags(tasks, progress, stall_timeout=120)
    assert found == {
        "ps:0": [],
        "worker:0": [],
        "worker:1": [],
        "worker:2": ["straggler"],
        "worker:3": ["restarting"],
        "worker:4": ["stalled"],
    }


def test_a_stalled_task_does_not_hide_a_slow_one_from_the_median() -> None:
    """Three workers: one stalled, one 5x slower than the third. With the stalled task's falling
    rate in the median (12, 2.4, 0.6 -> 2.4), the slow one was not flagged."""
    tasks = [(f"worker:{i}", "worker", TaskState.RUNNING) for i in range(3)]
    progress = {
        "worker:0": Progress(1200, 12.0, 1.0),
        "worker:1": Progress(240, 2.4, 1.0),
        "worker:2": Progress(50, 0.6, 300.0),  # no step for 300 s
    }
    assert flags(tasks, progress, stall_timeout=120) == {
        "worker:0": [],
        "worker:1": ["straggler"],
        "worker:2": ["stalled"],
    }


def test_step_lines_after_a_logged_rate_win_and_a_zero_rate_before_any_step_is_none(tmp_path: Path) -> None:
    """tf.train.Supervisor logs `global_step/sec: 0` once before its first step; its steps then
    advance at ~270/s. The rate line must not outrank them for the whole window."""
    first = [(NOW - 30, b"INFO:tensorflow:global_step/sec: 0\n")]
    steps = [(NOW - 28 + s, b"step %d\n" % (270 * s)) for s in range(28)]
    p = progress_of(write_log(tmp_path, first + steps))
    assert p.steps_per_sec == pytest.approx(270, rel=0.05)
    (tmp_path / "zero").mkdir()
    only_zero = progress_of(write_log(tmp_path / "zero", [(NOW - 5, b"INFO:tensorflow:global_step/sec: 0\n")]))
    assert only_zero.steps_per_sec is None


def test_marks_are_wire_records() -> None:
    mark = Mark(1.5, "step 3")
    assert Mark.from_wire(mark.to_wire()) == mark


def test_status_shows_steps_rates_and_flags_of_stand_in_tasks_at_chosen_rates(tmp_path: Path, home: Path) -> None:
    ports = free_ports(5)
    workers = ", ".join(f"localhost:{p}" for p in ports[2:])
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: rates
grace_period: 2
startup_timeout: 20
progress: {{stall_timeout: 4, window: 10}}
jobs:
  ps:
    hosts: [localhost:{ports[0]}]
    command: "{fake(f"--port {ports[0]} --sleep -1")}"
  chief:
    hosts: [localhost:{ports[1]}]
    command: "{fake(f"--port {ports[1]} --sleep -1 --steps-per-sec 20 --steps-for 2")}"
  worker:
    hosts: [{workers}]
    command: "{fake("--port -1 --sleep -1 --steps-per-sec $((4 + 8 * {task_index}))")}"
""")
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    try:
        # Deliberately 8 s: rates measured over seconds of steps, and the chief's 2 s of steps
        # followed by more than stall_timeout (4 s) of none.
        time.sleep(8)
        shot = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)
        assert shot["run"]["state"] == "running", shot["run"]["reason"]
        assert shot["run"]["id"] == up.stdout.strip()
        tasks = {t["task"]: t for t in shot["tasks"]}
        assert {name: t["flags"] for name, t in tasks.items()} == {
            "ps:0": [],
            "chief:0": ["stalled"],  # 2 s of steps, then nothing for more than stall_timeout
            "worker:0": ["straggler"],  # 4 steps/s; its job's median is 12
            "worker:1": [],
            "worker:2": [],
        }
        assert tasks["ps:0"]["step"] is None and tasks["ps:0"]["steps_per_sec"] is None
        assert 30 <= tasks["chief:0"]["step"] <= 42 and tasks["chief:0"]["steps_per_sec"] < 8  # 20 while it ran
        for i, rate in enumerate((4, 12, 20)):
            assert tasks[f"worker:{i}"]["steps_per_sec"] == pytest.approx(rate, rel=0.35)
        # each counted from its own start (a loaded machine starts them up to a few seconds late)
        assert 0 < tasks["worker:0"]["step"] < tasks["worker:1"]["step"] < tasks["worker:2"]["step"] <= 20 * 10
        table = tfctl("-f", str(cluster), "status", home=home, env={"COLUMNS": "200"}).stdout
        header = next(line for line in table.splitlines() if line.startswith("TASK"))
        assert header.split()[:9] == ["TASK", "ADDRESS", "STATE", "PID", "EXIT", "UPTIME", "LISTEN", "STEP", "STEPS/S"]
        assert "running, straggler" in table and "running, stalled" in table
    finally:
        assert tfctl("-f", str(cluster), "down", home=home).returncode == 0


def test_a_worker_that_never_trained_is_named_when_the_chief_ends_the_run(tmp_path: Path, home: Path) -> None:
    ports = free_ports(2)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: silent
grace_period: 1
jobs:
  worker:
    hosts: [localhost:{ports[0]}, localhost:{ports[1]}]
    command: "{fake("--port -1 --sleep $((3 - 4 * {task_index})) --steps-per-sec $((20 - 20 * {task_index}))")}"
""")
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0 and "job succeeded: worker:0 finished successfully" in up.stderr, up.stderr
    assert "worker:1: never logged a training step, while worker:0 did: it may not have trained" in up.stderr
    assert "worker:0: never logged" not in up.stderr
    status = tfctl("-f", str(cluster), "status", home=home)
    assert "worker:1: never logged a training step" in status.stdout


def test_a_short_burst_of_steps_long_ago_counts_its_quiet_time(tmp_path: Path) -> None:
    # 40 steps noted within one second, then nothing for 6 s: slow, not unknown.
    log = write_log(
        tmp_path,
        [
            (NOW - 7, b"".join(b"step %d\n" % i for i in range(20))),
            (NOW - 6, b"".join(b"step %d\n" % i for i in range(20, 40))),
        ],
    )
    p = progress_of(log)
    assert p.step == 39 and p.steps_per_sec == pytest.approx(39 / 7, rel=0.01)  # from the first step to now


@pytest.mark.parametrize(
    "line, found",
    [
        ("step 120 loss 0.31 accuracy 0.9 steps/s 40.1", {"loss": 0.31, "accuracy": 0.9}),
        ("INFO:tensorflow:loss = 0.3, step = 120 (0.5 sec)", {"loss": 0.3}),
        ("120/938 [====>....] - ETA: 0s - loss: 0.3121 - accuracy: 0.9100", {"loss": 0.3121, "accuracy": 0.91}),
        (
            "final step 400 loss nan accuracy 0.96 time 12.3s checkpoint /x/ckpt-4",
            {"loss": float("nan"), "accuracy": 0.96},
        ),
        ("Epoch 3/10", {}),
        ("[0.988 1.431]", {}),
        ("global_step/sec: 31.4", {}),
        ("val_loss=1e-3 lr 0.01", {"val_loss": 0.001, "lr": 0.01}),
        ("using 4 GPUs at 80%", {}),
    ],
)
def test_the_models_own_numbers_are_read_from_a_progress_line(line: str, found: dict) -> None:
    got = metrics(line)
    assert set(got) == set(found)
    assert all(got[k] == v or (math.isnan(got[k]) and math.isnan(v)) for k, v in found.items())


def test_steps_per_second_for_the_report_come_from_windows_of_at_least_10_s() -> None:
    """A steady 2 steps/s logged once a second, with line times cut to the second."""
    marks = [Mark(float(int(1000 + 0.5 * i)), f"step {i}") for i in range(0, 120)]
    swinging = [rate for _, rate in ProgressReader().history(marks)]
    steady = [rate for _, rate in ProgressReader().history(marks, min_span=10.0)]
    assert steady and all(1.8 <= rate <= 2.2 for rate in steady), steady
    assert len(swinging) > len(steady)
