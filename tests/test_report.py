"""`tfctl report`: the page drawn from made-up runs (pure), from a real localhost run with a
restart, and that run's page as a real headless Chromium shows it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest

from bench.waiting import wait_until
from tests.conftest import fake, free_ports, tfctl
from tests.fake_runs import FAKE_FILE, amend, tfctl_here, write
from tests.fakes import TaskScript
from tests.test_cli_localhost import latest_run, write_cluster
from tests.test_restart import agent, once_then, start, wait_state  # noqa: F401 (agent: a fixture)
from tfctl.cluster.agent import HostAgent
from tfctl.controller.views.report import OUTCOME_COLOURS, Event, Resources, RunReport, Span, TaskReport, render
from tfctl.controller.views.report_gather import masked
from tfctl.runs.accounting import TaskCost
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import Mark, RestartRule, TaskState
from tfctl.tf.progress import ProgressReader
from tfctl.tf.results import Metric

T0 = 1_790_000_000.0
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HOSTILE = '</title><script>alert(1)</script><img src=x onerror="fetch(1)">\x1b]52;c;bad\x07'


def run_of(*tasks: TaskReport, **changes: object) -> RunReport:
    facts: dict = dict(
        run_id="t-20260101-000000-abcd",
        cluster_name="t",
        cluster_file="/c/cluster.yaml",
        backend="ssh",
        state="succeeded",
        reason=None,
        started_at=T0,
        ended_at=T0 + 100,
        generated_at=T0 + 200,
        tasks=tasks,
    )
    return RunReport(**{**facts, **changes})


def task_of(name: str = "worker:0", **changes: object) -> TaskReport:
    facts: dict = dict(name=name, address="localhost:2222", state="succeeded", end="exited with code 0")
    return TaskReport(**{**facts, **changes})


def test_every_text_from_a_task_is_escaped_and_its_control_characters_shown() -> None:
    hostile = task_of(
        HOSTILE,
        end=HOSTILE,
        last_line=HOSTILE,
        events=(Event(T0 + 5, "end", HOSTILE),),
        spans=(Span(T0, T0 + 5, "failed", HOSTILE),),
        rates=((T0 + 1, 1.0), (T0 + 3, 2.0)),
        diagnosis=(HOSTILE, HOSTILE),
    )
    page = render(run_of(hostile, reason=HOSTILE, unreachable=((HOSTILE, HOSTILE),)))
    assert "<script" not in page and "<img" not in page and "\x1b" not in page and "\x07" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "^[]52;c;bad^G" in page
    assert page.count("<title>") == page.count("</title>")  # no task closed the page's own title


def test_the_page_fetches_nothing_and_runs_nothing() -> None:
    page = render(run_of(task_of(rates=((T0, 1.0), (T0 + 9, 3.0)), resources=Resources(((T0, 50.0),), ((T0, 1e6),)))))
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(|\bsrc=|\bhref=", page, re.I)
    assert re.findall(r"https?://[^\"' ]+", page) == ["http://www.w3.org/2000/svg"] * page.count("<svg")
    assert "default-src 'none'" in page  # the page's own policy forbids fetching, whatever it held


def test_a_bar_per_run_coloured_by_how_it_ended_and_a_mark_per_moment() -> None:
    restarted = task_of(
        spans=(Span(T0 + 10, T0 + 30, "failed", "was killed by signal 9"), Span(T0 + 31, T0 + 90, "succeeded", "ok")),
        events=(
            Event(T0 + 10, "start"),
            Event(T0 + 12, "listening"),
            Event(T0 + 15, "first step", "step 1"),
            Event(T0 + 30, "restart", "was killed by signal 9"),
        ),
    )
    page = render(run_of(restarted, task_of("ps:0", spans=(Span(T0 + 1, T0 + 100, "stopped", "down"),))))
    bars = re.findall(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)" height="\d+" fill="(#\w+)"', page)
    colours = [fill for _, _, fill in bars]
    assert colours == [OUTCOME_COLOURS["failed"], OUTCOME_COLOURS["succeeded"], OUTCOME_COLOURS["stopped"]]
    first, second = (float(x) for x, _, _ in bars[:2])
    assert first < second  # in time order, on one scale
    assert 'class="listen"' in page and 'class="step"' in page and 'class="restart"' in page
    assert "was killed by signal 9" in page


def test_cpu_and_memory_are_drawn_only_for_a_run_whose_hosts_recorded_them() -> None:
    plain = render(run_of(task_of()))
    assert "CPU / memory" not in plain
    mib = 1024 * 1024
    measured = task_of(
        resources=Resources(cpu=((T0, 20.0), (T0 + 50, 180.0)), memory=((T0, 256 * mib), (T0 + 100, 512 * mib)))
    )
    page = render(run_of(measured, task_of("ps:0")))
    panel = page[page.index('id="resources"') :]
    cpu, memory = re.findall(r'<polyline points="([^"]+)"', panel)
    cpu_y = [float(p.split(",")[1]) for p in cpu.split()]
    memory_y = [float(p.split(",")[1]) for p in memory.split()]
    assert cpu_y[1] < cpu_y[0] and memory_y[1] < memory_y[0]  # up is more
    assert memory_y[1] == cpu_y[1]  # each chart's peak at its top
    assert "memory MiB" in panel and ">512<" in panel  # bytes shown in MiB


def test_steps_per_second_over_time_start_afresh_after_a_restart() -> None:
    marks = [Mark(T0 + t, f"step {s}") for t, s in ((0, 0), (2, 20), (4, 40), (6, 0), (8, 10), (10, 20))]
    assert ProgressReader().history(marks) == [(T0 + 2, 10.0), (T0 + 4, 10.0), (T0 + 8, 5.0), (T0 + 10, 5.0)]
    rates = [Mark(T0 + 1, "INFO:tensorflow:global_step/sec: 31.5"), Mark(T0 + 2, "step 5")]
    assert ProgressReader().history(rates) == [(T0 + 1, 31.5)]  # the program's own word wins


def test_a_one_point_series_is_drawn_as_a_point_and_50_tasks_get_50_colours() -> None:
    lone = render(run_of(task_of(rates=((T0 + 5, 2.0),))))
    assert re.search(r'<circle cx="[\d.]+" cy="[\d.]+" r="3.5" fill="#\w+"><title>worker:0</title>', lone)
    many = render(run_of(*(task_of(f"worker:{i}", rates=((T0, 1.0), (T0 + 9, 2.0))) for i in range(50))))
    strokes = re.findall(r'<polyline points="[^"]+" fill="none" stroke="([^"]+)"', many)
    assert len(strokes) == 50 and len(set(strokes)) == 50


def test_the_header_gives_the_runs_result_from_its_final_evaluation_and_says_localhost() -> None:
    result = {"accuracy": Metric(0.9721, 600, "worker:0")}
    facts = render(run_of(task_of(), result=result, local=True)).split("<h2>", 1)[0]
    assert "<th>result</th><td>accuracy 0.9721 (step 600, worker:0)</td>" in facts
    assert "<th>backend</th><td>localhost (every task on this machine; backend ssh)</td>" in facts
    facts = render(run_of(task_of())).split("<h2>", 1)[0]
    assert "<th>result</th><td>no final evaluation line found" in facts and "<td>ssh</td>" in facts


def test_a_short_runs_steps_are_charted_as_steps_over_time_with_each_tasks_average_rate() -> None:
    """22 s of steps, one step/s line a second: steps/s over 10 s spans would be two dots."""
    steps = tuple((T0 + t, 10.0 * t) for t in range(23))
    short = render(run_of(task_of(rates=((T0 + 10, 10.0), (T0 + 20, 10.0)), steps=steps), ended_at=T0 + 22))
    chart = short.split("<h2>Steps per second</h2>", 1)[1].split("<h2>", 1)[0]
    assert "Too short a run for steps/s over time" in chart and "Average steps/s: worker:0 10." in chart
    (points,) = re.findall(r'<polyline points="([^"]+)"', chart)
    assert len(points.split()) == 23
    long = render(run_of(task_of(rates=tuple((T0 + 10 * i, 10.0) for i in range(1, 9)), steps=steps)))
    assert "Too short" not in long and 'aria-label="steps/s"' in long


def test_a_failed_run_without_a_known_error_says_what_failed_first_and_its_last_error_line() -> None:
    first = task_of(
        "worker:1",
        state="failed",
        end="exited with code 1",
        spans=(Span(T0, T0 + 12, "failed", "exited with code 1"),),
        tail=("step 40", "Traceback (most recent call last):", "ValueError: shapes (3,) and (4,) differ", "bye"),
    )
    then = task_of(
        "worker:0",
        state="failed",
        end="was killed by signal 9 (SIGKILL)",
        spans=(Span(T0, T0 + 15, "failed", "was killed by signal 9"),),
        last_line="step 41",
    )
    page = render(run_of(then, first, state="failed"))
    told = page.split("<h2>Diagnosis</h2>", 1)[1]
    assert "found nothing wrong" not in told
    assert (
        "<li><b>worker:1</b> failed first, at +12s: exited with code 1; its last error line: "
        "<code>ValueError: shapes (3,) and (4,) differ</code></li>"
    ) in told
    assert "<li><b>worker:0</b> failed at +15s: was killed by signal 9 (SIGKILL); its last error line: " in told
    assert "found nothing wrong" in render(run_of(task_of()))


def test_the_timeline_says_whole_how_each_task_ended() -> None:
    ps = task_of(
        "ps:0",
        state="stopped",
        end="was stopped (by tfctl once the job succeeded)",
        brief="stopped once the job succeeded",
    )
    page = render(run_of(ps))
    assert ">stopped once the job succeeded<title>was stopped (by tfctl once the job succeeded)</title>" in page


def test_fifty_tasks_are_counted_by_how_they_ended_not_listed() -> None:
    tasks = [task_of("worker:0")] + [task_of(f"worker:{i}", state="stopped", end="was stopped") for i in range(1, 50)]
    facts = render(run_of(*tasks)).split("<h2>", 1)[0]
    assert "50: 49 stopped, 1 succeeded" in facts and "worker:7" not in facts


def test_the_models_numbers_are_charted_and_a_quiet_tasks_lines_shown_beside_its_row() -> None:
    curve = (("loss", ((T0 + 10, 0.9), (T0 + 20, 0.5), (T0 + 30, 0.3))), ("accuracy", ((T0 + 30, 0.9),)))
    quiet = task_of(
        "worker:1",
        state="stopped",
        note="never logged a training step, while worker:0 did: it may not have trained",
        tail=("Scanning workers for devices: 3 total workers", HOSTILE),
        cost=TaskCost("worker:1", 30.0, 1.5, 0),
    )
    page = render(run_of(task_of(metrics=curve, step=300, cost=TaskCost("worker:0", 30.0, 45.0, 1)), quiet))
    assert "<h2>loss</h2>" in page and "<h2>accuracy</h2>" in page
    row = page[page.index('<td class="n">worker:1</td>') :].split("</table>", 1)[0]
    assert "never logged a training step" in row and "Scanning workers for devices" in row
    assert "<script" not in row and "^[]52;c;bad^G" in row
    assert all(f'<td class="n">{cell}</td>' in page for cell in ("0.3", "45 s", "30 s"))  # loss, CPU, GPU
    assert "wall 1m40s, CPU 46 s, GPU 30 s" in page


def test_a_task_with_one_last_line_shows_its_last_line_not_its_last_1_lines() -> None:
    page = render(run_of(task_of("worker:1", state="failed", end="exited with code 1", tail=("boom",))))
    assert "worker:1: its last line</summary>" in page and "last 1 lines" not in page
    assert "worker:1: its last 2 lines</summary>" in render(run_of(task_of("worker:1", tail=("a", "b"))))


def test_the_page_says_how_the_run_was_started_with_secrets_masked() -> None:
    env = masked({"TF_CONFIG": '{"cluster": {}}', "WANDB_API_KEY": "abc123", "DB_PASSWORD": "pw", "LANG": "C"})
    page = render(
        run_of(
            task_of(),
            commands=(("worker:0", "python train.py --task_index=0"),),
            tf_config='{"cluster": {"worker": ["h1:2222"]}}',
            env=tuple(sorted(env.items())),
            versions=(("tfctl", "0.1.0"), ("h1", "python 3.11, tensorflow 2.16.1")),
        )
    )
    assert "python train.py --task_index=0" in page and "h1:2222" in page
    assert "abc123" not in page and ">pw<" not in page and "<td>C</td>" in page
    assert "tfctl: 0.1.0; h1: python 3.11, tensorflow 2.16.1" in page


def test_a_task_host_records_when_each_earlier_run_started_and_ended(agent: HostAgent) -> None:  # noqa: F811
    start(agent, "r", "echo run; exit 3", RestartRule("on-failure", 2, 0.2))
    info = wait_state(agent, "r", (TaskState.FAILED,))
    assert [a.end for a in info.attempts] == info.earlier_ends == ["exited with code 3"] * 2
    moments = [m for a in info.attempts for m in (a.started_at, a.ended_at)]
    assert info.started_at is not None and info.ended_at is not None
    assert moments == sorted(moments) and moments[-1] <= info.started_at <= info.ended_at


def test_no_run_yet_and_an_unknown_run_say_what_to_do(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cluster.yaml").write_text("name: t\ncommand: x\njobs:\n  worker: [localhost:2222]\n")
    monkeypatch.chdir(tmp_path)
    none_yet = tfctl_here("report")
    assert (
        none_yet.code == 2
        and "no run of cluster.yaml yet" in none_yet.err
        and "tfctl -f cluster.yaml up" in none_yet.err
    )
    unknown = tfctl_here("report", "--run", "nope")
    assert unknown.code == 2 and "no run 'nope'" in unknown.err and "tfctl runs" in unknown.err


def test_a_failed_run_reports_its_diagnosis_and_restarts_whose_times_were_not_recorded(
    fake_backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake hosts, like a monitor older than `TaskInfo.attempts`, count restarts without times."""
    monkeypatch.chdir(tmp_path)
    restarting = (
        "  worker:\n    hosts: [h1:2223, h2:2222]\n    restart: {policy: on-failure, max_restarts: 1, backoff: 0}\n"
    )
    write(tmp_path, FAKE_FILE.replace("  worker: [h1:2223, h2:2222]\n", restarting))
    oom = "ResourceExhaustedError: OOM when allocating tensor with shape[4096,4096] on /device:GPU:0"
    fake_backend.scripts.update(
        {
            "ps:0": TaskScript(lines=["ps: listening"]),
            "worker:0": TaskScript(end_after=2, exit_code=1, lines=["step 1", oom]),
            "worker:1": TaskScript(lines=["step 1"]),
        }
    )
    assert tfctl_here("up").code == 1
    ran = tfctl_here("report", "-o", "-")
    assert ran.code == 0, ran.err
    page = ran.out
    assert page.startswith("<!DOCTYPE html>") and "failed: worker:0 on h1 exited with code 1" in page
    assert "worker:0</b>: " in page and "out of memory" in page.lower() and "<i>fix:</i>" in page
    assert "worker:0: restarted before tfctl recorded when" in page
    assert "exited with code 1 after 1 restart" in page
    assert not (tmp_path / "report.html").exists() and not list(tmp_path.glob("*.html"))  # stdout only


def test_tasks_stopped_because_the_job_succeeded_are_not_said_to_be_stopped_by_down(
    fake_backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    fake_backend.scripts.update(
        {"ps:0": TaskScript(lines=["ps: listening"]), "worker:0": TaskScript(end_after=2, lines=["step 1"])}
    )
    assert tfctl_here("up").code == 0
    page = tfctl_here("report", "-o", "-").out
    assert (
        "was stopped (by tfctl once the job succeeded)" in page and "succeeded: worker:0 finished successfully" in page
    )
    assert "tfctl down" not in page
    assert ">stopped once the job succeeded<title>" in page  # whole in the timeline's narrow column


def test_a_failed_run_whose_logs_hold_no_known_error_says_what_failed(
    fake_backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    fake_backend.scripts.update(
        {
            "ps:0": TaskScript(lines=["ps: listening"]),
            "worker:0": TaskScript(end_after=2, exit_code=3, lines=["step 1", "RuntimeError: my own check failed"]),
            "worker:1": TaskScript(lines=["step 1"]),
        }
    )
    assert tfctl_here("up").code == 1
    told = tfctl_here("report", "-o", "-").out.split("<h2>Diagnosis</h2>", 1)[1]
    assert "found nothing wrong" not in told
    assert "<li><b>worker:0</b> failed at +" in told and ": exited with code 3; its last error line: " in told
    assert "<code>RuntimeError: my own check failed</code>" in told


def restarted_run(tmp_path: Path, home: Path) -> str:
    """A finished localhost run: a ps that says it listens as TF does, and two workers that each
    die once, are restarted by their host, step and succeed."""
    ports = free_ports(3)
    tf_line = f"echo 'I0000 grpc_server_lib.cc:467] Started server with target: grpc://localhost:{ports[0]}'"
    ps = f"{tf_line}; exec " + fake(f"--name ps --port {ports[0]} --sleep -1")
    cluster = write_cluster(tmp_path, ports, "PS", "WORKER", extra="success_policy: all_workers")
    worker = fake(
        f"--name w{{task_index}} --port $(({ports[1]} + {{task_index}} * {ports[2] - ports[1]})) "
        "--steps-per-sec 20 --sleep 5"
    )
    dies_once = once_then("sleep 1; kill -9 $$", f"exec {worker}", tmp_path / "died-once-{task_index}")
    text = cluster.read_text().replace('"PS"', json.dumps(ps))
    text = text.replace(
        '    command: "WORKER"',
        f"    command: {json.dumps(dies_once)}\n    restart: {{policy: on-failure, max_restarts: 1, backoff: 0.5}}",
    )
    cluster.write_text(text)
    up = tfctl("up", "-f", str(cluster), home=home)
    assert up.returncode == 0, up.stderr + up.stdout
    return latest_run(home)


def test_the_report_of_a_run_with_a_restart_shows_every_task_in_a_real_browser(tmp_path: Path, home: Path) -> None:
    run_id = restarted_run(tmp_path, home)
    page = tmp_path / "report.html"
    made = tfctl("report", "--run", run_id, "-o", str(page), home=home)
    assert made.returncode == 0, made.stderr
    html = page.read_text()
    for task in ("ps:0", "worker:0", "worker:1"):
        assert f">{task}<" in html
    assert html.count('class="restart"') == 2 and html.count('class="listen"') == 1  # the ps's TF line
    assert html.count('class="step"') == 2  # each worker's first step after its restart
    assert "was killed by signal 9" in html and "exited with code 0 after 1 restart" in html
    assert "<th>backend</th><td>localhost (every task on this machine; backend ssh)</td>" in html
    assert re.search(r'<polyline points="[\d.]+,[\d.]+ [\d.]+,[\d.]+', html)  # steps/s drawn over time
    panel = html[html.index('id="resources"') :]  # CPU and memory, as each task's monitor sampled them
    assert all(f">{task}<" in panel for task in ("ps:0", "worker:0", "worker:1")), panel[:2000]
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install chromium): the page was checked as text only")
    pixels = screenshot(page, tmp_path / "report.png", tmp_path / "chromium")
    rows = {
        colour: coloured_rows(pixels, hex_rgb(OUTCOME_COLOURS[colour])) for colour in ("failed", "succeeded", "stopped")
    }
    bands = [set(band) for band in row_bands(set().union(*rows.values()))]
    assert len(bands) == 3, bands  # one row of bars per task
    ps, *workers = bands
    assert rows["stopped"] & ps and not (rows["failed"] | rows["succeeded"]) & ps
    for band in workers:  # each worker: a red run, then a green one, on its own row
        assert rows["failed"] & band and rows["succeeded"] & band and not rows["stopped"] & band


def fifty_task_run(tmp_path: Path, fake_backend) -> str:
    """A finished run of the fake backend: a ps and 49 workers logging steps, loss and accuracy
    over its last 60 s; worker:7 never trains, worker:12's last line is one 400-character word.
    The hosts' clocks are moved back, so the run began 100 s ago."""
    workers = ", ".join(f"h{1 + i % 2}:{3000 + i}" for i in range(49))
    write(tmp_path, FAKE_FILE.replace("  worker: [h1:2223, h2:2222]\n", f"  worker: [{workers}]\n"))
    fake_backend.scripts["ps:0"] = TaskScript(lines=["ps: listening"], cpu_seconds=40.0)
    for i in range(49):
        lines = [f"step {20 * k} loss {2.0 / (k + 2 + i / 10):.4f} accuracy {0.5 + k / 120:.3f}" for k in range(60)]
        fake_backend.scripts[f"worker:{i}"] = TaskScript(lines=lines, cpu_seconds=90.0 + i)
    fake_backend.scripts["worker:0"].end_after = 3
    fake_backend.scripts["worker:7"] = TaskScript(
        lines=["master.cc:243] Scanning workers for devices: 3 total workers"]
    )
    fake_backend.scripts["worker:12"].lines.append("x" * 400)
    assert tfctl_here("up").code == 0
    store = RunStore()
    (record,) = store.all()
    amend(store, record.run_id, created_at=record.created_at - 100)
    for host in fake_backend.hosts.values():
        for name, info in host.tasks.items():
            host.tasks[name] = info.replace(started_at=(info.started_at or time.time()) - 99)
    return record.run_id


def test_a_fifty_task_run_reads_well_in_a_real_browser(fake_backend, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    fifty_task_run(tmp_path, fake_backend)
    page = tmp_path / "report.html"
    assert tfctl_here("report", "-o", str(page)).code == 0
    html = page.read_text()
    assert "<td>50: 49 stopped, 1 succeeded</td>" in html
    assert "was stopped (by tfctl once the job succeeded)" in html
    quiet = html[html.index('<td class="n">worker:7</td>') :].split('<td class="n">worker:8</td>', 1)[0]
    assert "never logged a training step" in quiet and "Scanning workers for devices" in quiet
    assert "<h2>loss</h2>" in html and "<h2>accuracy</h2>" in html
    steps = html[html.index("<h2>Steps per second</h2>") : html.index("<h2>loss</h2>")]
    strokes = re.findall(r'stroke="([^"]+)" stroke-width="2"', steps)
    assert len(strokes) == 48 and len(set(strokes)) == 48  # every task that stepped, each its own colour
    peak = max(float(v) for v in re.findall(r'text-anchor="end">([\d.]+)</text>', steps))
    assert 20 <= peak < 30  # 20 steps a second: windows of 10 s, no swing to 40 or more
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install chromium): the page was checked as text only")
    pixels = screenshot(page, tmp_path / "report.png", tmp_path / "chromium", height=4600)
    right_edge = {px for row in pixels for px in row[-16:]}
    assert right_edge == {(255, 255, 255)}  # nothing runs off the page: no sideways scrolling


def screenshot(page: Path, out: Path, profile: Path, height: int = 900) -> list[list[tuple[int, int, int]]]:
    """The page as headless Chromium draws it in a window 1200 wide, as rows of RGB pixels."""
    assert CHROMIUM is not None
    browser = subprocess.Popen(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--screenshot={out}",
            f"--window-size=1200,{height}",
            page.as_uri(),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its helpers share its process group: stopped with it, by its pid
    )
    try:
        browser.wait(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(browser.pid, signal.SIGKILL)
        browser.wait()
    wait_until(out.exists, 5, "the screenshot")
    return read_png(out.read_bytes())


def read_png(data: bytes) -> list[list[tuple[int, int, int]]]:
    """A non-interlaced 8-bit RGB or RGBA PNG, as Chromium writes its screenshots."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, header
    size = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(idat), width * size
    rows: list[list[tuple[int, int, int]]] = []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - size] if i >= size else 0
            up, corner = previous[i], previous[i - size] if i >= size else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                near = min((abs(p - left), 0, left), (abs(p - up), 1, up), (abs(p - corner), 2, corner))[2]
                line[i] = (line[i] + near) & 255
        rows.append([(line[x], line[x + 1], line[x + 2]) for x in range(0, stride, size)])
        previous = line
    return rows


def hex_rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def coloured_rows(pixels: list[list[tuple[int, int, int]]], rgb: tuple[int, int, int], least: int = 20) -> set[int]:
    """Rows with at least `least` pixels of about that colour: where bars of it are drawn."""
    return {
        y
        for y, row in enumerate(pixels)
        if sum(1 for px in row if all(abs(a - b) <= 8 for a, b in zip(px, rgb))) >= least
    }


def row_bands(rows: set[int]) -> list[range]:
    """Runs of adjacent rows, top first."""
    bands: list[range] = []
    for y in sorted(rows):
        if bands and y == bands[-1].stop:
            bands[-1] = range(bands[-1].start, y + 1)
        else:
            bands.append(range(y, y + 1))
    return bands
