"""`tfctl report --sweep`: the page of a real localhost sweep whose tasks log their accuracy at
steps (one trial with a hostile parameter, one failing before it logs any), read as text and
as a real headless Chromium draws it; the page drawn from made-up trials (pure); and the inputs
refused."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAKE_TASK, tfctl
from tests.test_report import CHROMIUM, hex_rgb, screenshot
from tfctl.controller.views.report import CHART_HEIGHT, LABEL, WIDTH, colour_of
from tfctl.controller.views.sweep_report import SweepReport, TrialRow, render

HOSTILE = "<script>alert(1)</script>\x1b]52;c;bad\x07"
# Each trial's two workers listen on the port tfctl chose, print `step 10 accuracy A`, ... (its
# `curve`), run a moment and exit `code`; worker 0 then prints its final evaluation line.
COMMAND = (
    "{python} %s --name {job_name}{task_index} --port -1 --lines 0 --accuracy {params.curve} "
    "--sleep 0.5 --exit {params.code} && echo 'final test accuracy {params.acc} after 30 global steps'" % FAKE_TASK
)
CURVES = {0: (0.2, 0.4, 0.6), 1: (0.3, 0.7, 0.9), 2: (0.1, 0.2, 0.3)}  # trial -> accuracy at steps 10, 20, 30
TOP, BOTTOM = 24.0, CHART_HEIGHT - 20.0  # of `line_chart`'s plot


def write_cluster(folder: Path) -> Path:
    path = folder / "cluster.yaml"
    tags = json.dumps([HOSTILE, "b", "c", "d"])  # JSON's escapes are YAML's: the control bytes arrive whole
    path.write_text(
        f"""name: sw
grace_period: 2
command: {json.dumps(COMMAND)}
params: {{acc: 0.5, curve: "0.1", code: 0, tag: plain}}
jobs:
  worker: [localhost, localhost]
sweep:
  zip:
    acc: [0.6, 0.9, 0.3, 0.8]
    curve: ["0.2,0.4,0.6", "0.3,0.7,0.9", "0.1,0.2,0.3", ""]
    code: [0, 0, 0, 3]
    tag: {tags}
  max_parallel: 2
"""
    )
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    """The sweep, run to its end once for the module: (cluster file, home, `sweep status --json`)."""
    folder = tmp_path_factory.mktemp("sweep")
    home = folder / "tfctl-home"
    cluster = write_cluster(folder)
    ran = tfctl("-f", str(cluster), "sweep", home=home, timeout=300)
    assert ran.returncode == 1, ran.stderr  # trial 3 failed
    shown = tfctl("-f", str(cluster), "sweep", "status", "--sort", "accuracy", "--json", home=home)
    assert shown.returncode == 0, shown.stderr
    return cluster, home, json.loads(shown.stdout)


def rows_of(page: str) -> list[str]:
    """The trials table's rows, in order."""
    table = page.split("<h2>Trials</h2>", 1)[1].split("</table>", 1)[0]
    return re.findall(r'<tr class="(?:best|trial)" id="trial-\d+">.*?</tr>', table)


def polylines(page: str) -> dict[int, list[list[tuple[float, float]]]]:
    """trial -> the points of each line drawn for it (its title names it)."""
    found: dict[int, list[list[tuple[float, float]]]] = {}
    for points, title in re.findall(r'<polyline points="([^"]+)"[^>]*><title>trial (\d+):', page):
        pairs = [tuple(float(v) for v in p.split(",")) for p in points.split()]
        found.setdefault(int(title), []).append([(x, y) for x, y in pairs])
    return {int(k): v for k, v in found.items()}


def test_the_sweep_page_ranks_marks_and_charts_every_trial(swept: tuple[Path, Path, dict[str, Any]]) -> None:
    cluster, home, status = swept
    folder = cluster.parent / "pages"
    folder.mkdir()
    best_run = status["trials"][0]["run_id"]
    assert tfctl("report", "--run", best_run, "-o", str(folder / f"{best_run}.html"), home=home).returncode == 0
    made = tfctl("-f", str(cluster), "report", "--sweep", "-o", str(folder / "sweep.html"), home=home)
    assert made.returncode == 0, made.stderr
    assert f"report of {status['sweep']} written to" in made.stderr
    page = (folder / "sweep.html").read_text()

    rows = rows_of(page)
    order = [int(i) for row in rows for i in re.findall(r'id="trial-(\d+)"', row)]
    assert order == [t["trial"] for t in status["trials"]] == [1, 0, 2, 3]  # as `sweep status --sort accuracy`
    assert status["best"] == 1 and "best" in rows[0] and all("best" not in row for row in rows[1:])
    for row, trial in zip(rows, status["trials"]):
        if trial["state"] == "succeeded":
            assert f">{trial['params']['acc']:g} @30<" in row and f">{trial['run_id']}<" in row
    failed = rows[order.index(3)]
    assert "failed: " in failed and "exited with code 3" in failed
    assert f'<a href="{best_run}.html">' in rows[0]  # the run report written beside the page
    other = status["trials"][1]["run_id"]
    assert f"tfctl report --run {other} -o {folder / other}.html" in rows[1]  # how to make its own

    lines = polylines(page)
    assert sorted(lines) == [0, 1, 2] and all(len(lines[t]) == 1 for t in lines)  # one curve a trial, not a task
    span = WIDTH - 10 - LABEL
    for trial, values in CURVES.items():
        (points,) = lines[trial]
        steps = [10 + (x - LABEL) / span * 20 for x, _ in points]
        shown = [(BOTTOM - y) / (BOTTOM - TOP) * 0.9 for _, y in points]  # 0.9: the chart's peak
        assert steps == pytest.approx([10, 20, 30], abs=0.05)
        assert shown == pytest.approx(values, abs=0.002), trial
    strokes = re.findall(r'<polyline points="[^"]+" fill="none" stroke="([^"]+)"', page)
    assert strokes == [colour_of(0), colour_of(1), colour_of(2)]  # a colour a trial, as its row's swatch
    missing = page.split("No accuracy curve for:", 1)[1]
    assert "<li>trial 3 (acc=0.8 curve= code=3 tag=d): its run logged no accuracy with a step</li>" in missing
    legend = page.split('<p class="legend">', 1)[1].split("</p>", 1)[0]
    assert "trial 1: acc=0.9 curve=0.3,0.7,0.9 code=0 tag=b" in legend

    assert "<script" not in page and "\x1b" not in page and "\x07" not in page  # the hostile tag, shown inert
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;^[]52;c;bad^G") == 3  # its row, its curve, the legend
    assert not re.search(r"<link|<img|<iframe|@import|url\(|\bsrc=", page, re.I)
    assert re.findall(r'href="([^"]+)"', page) == [f"{best_run}.html"]  # the one link: beside it

    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install chromium): the page was checked as text only")
    pixels = screenshot(folder / "sweep.html", folder / "sweep.png", folder / "chromium", height=1100)
    for trial in CURVES:  # each trial's line, drawn in its colour on one chart: far more than its swatches
        rgb = hex_rgb(colour_of(trial))
        drawn = sum(1 for row in pixels for px in row if all(abs(a - b) <= 8 for a, b in zip(px, rgb)))
        assert drawn > 800, (trial, drawn)
    assert {px for row in pixels for px in row[-16:]} == {(255, 255, 255)}  # nothing runs off the page


def test_the_metric_can_be_chosen_and_the_page_written_to_stdout(swept: tuple[Path, Path, dict[str, Any]]) -> None:
    cluster, home, status = swept
    shown = tfctl("report", "--sweep", status["sweep"], "--metric", "accuracy", "--min", "-o", "-", home=home)
    assert shown.returncode == 0, shown.stderr
    order = [int(i) for i in re.findall(r'<tr class="(?:best|trial)" id="trial-(\d+)">', shown.stdout)]
    assert order == [2, 0, 1, 3]  # the smallest first, a trial without it last, as `sweep status --min`
    assert "--sort accuracy --min" in shown.stdout and not list(cluster.parent.glob("*.html"))


@pytest.mark.parametrize(
    "args, words",
    [
        (("report", "--sweep", "nope"), "no sweep 'nope'"),
        (("report", "--sweep", "--metric", "top5"), "no trial of sweep"),
        (("report", "--metric", "loss"), "--metric and --min choose a sweep's chart"),
        (("report", "--sweep", "--run", "x"), "--sweep reports on a sweep, --run on a run"),
    ],
)
def test_bad_input_exits_2_saying_what_to_do(
    swept: tuple[Path, Path, dict[str, Any]], args: tuple[str, ...], words: str
) -> None:
    cluster, home, _ = swept
    refused = tfctl("-f", str(cluster), *args, home=home)
    assert refused.returncode == 2 and words in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and "hint:" in refused.stderr
    if "top5" in args:
        assert "its trials logged accuracy" in refused.stderr


def test_a_file_without_a_sweep_yet_says_how_to_start_one(tmp_path: Path, home: Path) -> None:
    cluster = write_cluster(tmp_path)
    refused = tfctl("-f", str(cluster), "report", "--sweep", home=home)
    assert refused.returncode == 2 and "no sweep of" in refused.stderr and "sweep`" in refused.stderr


def trial(index: int, state: str = "succeeded", **params: Any) -> dict[str, Any]:
    """A made-up trial's row: its loss, if it succeeded."""
    return dict(
        index=index,
        params=params,
        state=state,
        state_text=state,
        metrics={"loss": f"{0.1 * (index + 1):g} @100"} if state == "succeeded" else {},
        run_id=f"r-{index}",
    )


def sweep_of(*rows: TrialRow, **changes: Any) -> SweepReport:
    facts: dict[str, Any] = dict(
        sweep_id="s-sweep-1",
        cluster_name="s",
        cluster_file="/c/cluster.yaml",
        state="done",
        reason=None,
        max_parallel=2,
        retries=0,
        created_at=1_790_000_000.0,
        ended_at=1_790_000_100.0,
        generated_at=1_790_000_200.0,
        trials=rows,
        metric="loss",
        smallest=True,
        best=0,
        metrics=("loss",),
    )
    return SweepReport(**{**facts, **changes})


def test_fifty_trials_get_fifty_colours_and_a_lone_point_is_drawn() -> None:
    rows = [TrialRow(**trial(i, lr=i), curve=((0.0, 1.0), (100.0, 0.1 * (i + 1)))) for i in range(50)]
    page = render(sweep_of(*rows, TrialRow(**trial(50, lr=50), curve=((100.0, 0.5),))))
    strokes = re.findall(r'<polyline points="[^"]+" fill="none" stroke="([^"]+)"', page)
    assert len(strokes) == 50 and len(set(strokes)) == 50
    assert re.search(r'<circle cx="[\d.]+" cy="[\d.]+" r="3.5" fill="[^"]+"><title>trial 50: lr=50</title>', page)
    assert "<h2>loss by step</h2>" in page and "the smallest first" in page and "--sort loss --min" in page


def test_a_sweep_no_trial_of_which_logged_a_metric_lists_them_all() -> None:
    pending = TrialRow(**trial(0, "pending", lr=0.1), no_curve="not started yet")
    page = render(sweep_of(pending, metric=None, best=None, metrics=()))
    assert "No trial logged a metric" in page and "trial order: no trial logged a metric" in page
    assert ">pending<" in page and "best" not in page.split("<h2>Trials</h2>", 1)[1]
