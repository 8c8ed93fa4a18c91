"""``traintel report`` / ``export-trace`` / ``compare``: jobs at exact timestamps written through
traintel's real pipeline into the embedded default's files, then read back by the CLI.

Rank 0 steps every 4 s, rank 1 every 5 s; both: model_init 10 s, six iterations in windows of
two, a 2 s checkpoint save (1 MB) after the fourth iteration, 1 s after the loop.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from tests.test_goodput import Job, at, run_job
from traintel import cli, semconv
from traintel.analysis import parallel
from traintel.analysis import report as report_module
from traintel.analysis.report import Series, WindowPoint, build_report
from traintel.analysis.report_html import render_html
from traintel.analysis.report_text import render_text
from traintel.analysis.summary import phase_rows, render, summarize
from traintel.exporters.file import OtlpJsonFileSpanExporter
from traintel.exporters.reader import analysis_files


def stepping(step: float, iterations: int = 6, config: dict[str, Any] | None = None) -> Callable[[Job], None]:
    def build(job: Job) -> None:
        app = job.open("application", 0)
        if config is not None:  # as traintel's own application span starts
            attributes = {semconv.CONFIG_PREFIX + key: value for key, value in config.items()}
            app.add_event(semconv.Event.TELEMETRY_INITIALIZATION.value, attributes, timestamp=at(0))
        job.span("model_init", 0, 10, app)
        loop = job.open("training_loop", 10, app)
        t = 10.0
        for number in range(iterations):
            job.iteration(loop, number, t, t + step).end(end_time=at(t + step))
            t += step
            if number == 3:
                job.span(
                    "checkpoint_save_sync", t, t + 2, loop,
                    **{semconv.CHECKPOINT_ITERATION: 4, semconv.CHECKPOINT_SIZE: 1_000_000},
                )  # fmt: skip
                t += 2
        loop.end(end_time=at(t))
        app.end(end_time=at(t + 1))

    return build


def two_ranks(directory: Path, monkeypatch: pytest.MonkeyPatch, perf_tag: str = "p1") -> None:
    monkeypatch.setenv("TRAINTEL_PERF_TAG", perf_tag)
    run_job(directory, monkeypatch, stepping(4), rank=0)
    run_job(directory, monkeypatch, stepping(5), rank=1)


def run_cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_report_numbers_are_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_job(tmp_path, monkeypatch, stepping(4), rank=0)
    report = build_report([tmp_path])
    data = report.as_dict()
    phases = {row["phase"]: row for row in data["phases"]}
    assert phases["application"]["total_s"] == pytest.approx(37)
    assert phases["model_init"]["total_s"] == pytest.approx(10)
    assert phases["model_init"]["share"] == pytest.approx(10 / 37)
    assert phases["training_iteration"]["count"] == 6
    assert phases["training_iteration"]["total_s"] == pytest.approx(24)
    assert phases["training_iteration"]["mean_s"] == pytest.approx(4)
    assert phases["checkpoint_save_sync"]["total_s"] == pytest.approx(2)
    windows = data["windows"]["rank 0 · run job-a"]
    assert [(w["first_iteration"], w["last_iteration"], w["iterations"]) for w in windows] == [
        (0, 1, 2), (2, 3, 2), (4, 5, 2)
    ]  # fmt: skip
    assert all(w["mean_s"] == pytest.approx(4) for w in windows)
    checkpoints = data["checkpoints"]
    assert (checkpoints["saves"], checkpoints["save_time_total_s"], checkpoints["bytes_total"]) == (
        1, pytest.approx(2), 1_000_000
    )  # fmt: skip
    (session,) = data["goodput"]
    assert session["total_seconds"] == pytest.approx(37)
    assert session["productive_seconds"] == pytest.approx(24)
    assert session["badput_seconds"]["initialization"] == pytest.approx(10)
    assert session["badput_seconds"]["checkpoint_save"] == pytest.approx(2)
    assert data["identity"]["perf_tags"] == [] and data["identity"]["ranks"] == [0]
    assert (data["start_unix_nano"], data["duration_s"]) == (at(0), pytest.approx(37))
    slowest = data["slowest_iterations"]
    assert slowest and all(len(s["trace_id"]) == 32 and len(s["span_id"]) == 16 for s in slowest)
    assert all(s["seconds"] == pytest.approx(4) for s in slowest)
    text = render_text(report)
    for expected in ("Wall time by phase", "model_init", "27.0%", "Goodput", "productive", "64.9%"):
        assert expected in text, expected


def test_a_loop_without_end_of_loop_figures_shows_its_windows_mean_in_text_and_html(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that left no end-of-loop figures (killed, still running, or spans of its own) has
    its windows' mean iteration time in the tables and the page, as ``--json`` has it (before:
    "-" in both, beside 4.0 in ``iterations.mean_s``)."""
    run_job(tmp_path, monkeypatch, stepping(4), rank=0)
    report = build_report([tmp_path])
    assert report.as_dict()["iterations"]["mean_s"] == pytest.approx(4)
    assert re.search(r"iteration time mean +4\.00 s \(windows\)", render_text(report))
    assert "<td>iteration time mean / p99</td><td>4.00 s (windows) / -</td>" in render_html(report)


def test_the_iteration_count_of_two_ranks_is_the_run_s_not_their_sum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks of 6 iterations each, no end-of-loop figures: the run ran 6 iterations, as
    ``traintel runs`` counts them (the window records add up to 12)."""
    two_ranks(tmp_path, monkeypatch)
    report = build_report([tmp_path])
    assert report.summary.window_iterations == 12  # the phase table's count, summed over ranks
    assert report.as_dict()["iterations"]["count"] == 6
    assert re.search(r"\n *iterations +6 *\n", render_text(report))
    assert "<td>iterations</td><td>6</td>" in render_html(report)
    summary = render(summarize([tmp_path])).replace("\n  ", " ")
    assert "Iterations: 12 in 6 window(s), summed over the 2 ranks; the run ran 6 (" in summary


def test_cli_report_text_json_and_skipped_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    two_ranks(tmp_path, monkeypatch)
    (damaged,) = [p for p in tmp_path.iterdir() if p.name.endswith("-1.otlp.jsonl")]
    with damaged.open("ab") as fh:
        fh.write(b"this is not json\n")
        fh.write(b'{"resourceSpans": [{"resource": {"attri')  # a crash mid-line
    code, out, err = run_cli("report", str(tmp_path), capsys=capsys)
    assert code == 0 and "Traceback" not in out + err
    assert "skipped" in out and "2 line(s)" in out and "truncated last line" in out
    assert "perf tag" in out and "p1" in out
    code, out, _ = run_cli("report", str(tmp_path), "--json", capsys=capsys)
    data = json.loads(out)
    assert data["skipped_lines"] == 2
    assert data["identity"]["ranks"] == [0, 1]
    assert sorted(data["windows"]) == ["rank 0 · run job-a", "rank 1 · run job-a"]
    assert [w["mean_s"] for w in data["windows"]["rank 1 · run job-a"]] == [pytest.approx(5)] * 3
    (tmp_path / "no-files").mkdir()
    code, _, err = run_cli("report", str(tmp_path / "no-files"), capsys=capsys)
    assert code == 2 and "no telemetry files" in err


@pytest.mark.parametrize(
    "command",
    [["summary"], ["goodput"], ["report"], ["report", "--json"], ["runs"], ["export-trace", "-o", "-"]],
)
def test_a_path_that_does_not_exist_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """A mistyped rank's file beside a real one is an error naming it, nothing printed (before:
    exit 0 and the other rank's report, the typo said nowhere; alone, "no telemetry files found
    in" it, as of an empty directory)."""
    run_job(tmp_path, monkeypatch, stepping(4), rank=0)
    (real,) = tmp_path.iterdir()
    typo = str(tmp_path / "job-a-0-1.otlp.jsnl")
    code, out, err = run_cli(*command, str(real), typo, capsys=capsys)
    assert (code, out, err) == (2, "", f"traintel: no such file or directory: {typo}\n")
    if command == ["report"]:
        code, out, err = run_cli("compare", str(real), typo, capsys=capsys)
        assert (code, out, err) == (2, "", f"traintel: no such file or directory: {typo}\n")


def test_the_goodput_table_of_several_ranks_names_the_rank_it_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 runs 37 s, rank 1 43 s: the goodput table (rank 0's, as ``traintel goodput``)
    says whose time it is, below a phase table summed over both (before: a 37 s total named
    no rank, beside 80 s of application time)."""
    two_ranks(tmp_path, monkeypatch)
    text = render_text(build_report([tmp_path]))
    assert re.search(r"Goodput · session s1 · perf tag p1 · rank 0 of each job\s", text)
    assert re.search(r" total +37\.00 s +100\.0%", text)


def test_html_report_is_self_contained_with_every_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_ranks(tmp_path / "runs", monkeypatch)
    page = render_html(build_report([tmp_path / "runs"]))
    for element in ('id="timeline"', 'id="iteration-time"', 'id="throughput"', 'id="goodput-0"',
                    'id="checkpoints"', 'id="heatmap"'):  # fmt: skip
        assert element in page, element
    assert page.count('class="cell"') == 6  # 2 ranks x 3 windows
    # 37 s + 43 s of application: the sum said, as in the terminal's table (before: not said)
    assert "<h2>Wall time by phase, summed over the 2 ranks</h2>" in page
    assert "<tr><td>application</td><td>2</td><td>80.00 s</td>" in page
    assert page.count('class="phase"') >= 2 * 4  # application, init, loop, save per rank
    # nothing to fetch: no scripts, stylesheets, images or fonts from anywhere
    for forbidden in ("<script", "<link", "src=", "url(", "@import"):
        assert forbidden not in page, forbidden
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_each_window_is_drawn_as_a_level_over_its_iterations() -> None:
    """A run of one window (a short job: windows close every 30 s) was a dot at its last iteration
    on an axis from 299 to 300; each window is a level from its first iteration to its last, the
    marker (its tooltip) at its end, and the axis starts where the first window does."""
    from traintel.analysis.report_html import _W, line_chart, window_line

    def points(chart: str) -> list[tuple[float, float]]:
        coords = re.search(r'<polyline class="series"[^>]* points="([^"]+)"', chart)
        assert coords is not None, chart
        return [(float(x), float(y)) for x, y in (pair.split(",") for pair in coords[1].split())]

    one = WindowPoint(0, 299, 300, 10**9, 9.0, 0.05)
    chart = line_chart([window_line("rank 0", "#000", [one], lambda p: p.mean_s, str)], "s", "iteration", "c")
    (left, level), (right, same) = points(chart)
    assert level == same and right == _W - 10 and left < right - 0.8 * _W / 2  # across the plot
    assert chart.count('class="point"') == 1 and f'cx="{right:.1f}"' in chart
    assert "rank 0: iterations 0-299: 0.03" in chart and ">0</text>" in chart and ">299</text>" in chart
    # resumed at 1,000: two windows, a step between them at 1,049/1,050
    two = [WindowPoint(1000, 1049, 50, 0, 1.0, 0.03), WindowPoint(1050, 1149, 100, 0, 4.0, 0.05)]
    xy = points(line_chart([window_line("r", "#000", two, lambda p: p.mean_s, str)], "s", "it", "d"))
    assert [y for _, y in xy][0::2] == [y for _, y in xy][1::2] and xy[0][1] != xy[2][1]
    assert xy[0][0] < xy[1][0] < xy[2][0] < xy[3][0] == _W - 10


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _screenshot(browser: str, page: Path, png: Path, profile: Path) -> None:
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=900,2400",
         f"--screenshot={png}", page.as_uri()],
        check=True, capture_output=True, timeout=90,
    )  # fmt: skip


@pytest.mark.process
def test_html_report_renders_in_headless_chromium(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); the HTML is not rendered")
    two_ranks(tmp_path / "runs", monkeypatch)
    page = tmp_path / "report.html"
    assert cli.main(["report", str(tmp_path / "runs"), "--html", str(page)]) == 0
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         f"--user-data-dir={tmp_path / 'p0'}", "--dump-dom", page.as_uri()],
        check=True, capture_output=True, text=True, timeout=90,
    ).stdout  # fmt: skip
    assert dom.count("<svg") >= 6 and "polyline" in dom and 'class="cell"' in dom
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    _screenshot(browser, blank, tmp_path / "blank.png", tmp_path / "p1")
    _screenshot(browser, page, tmp_path / "report.png", tmp_path / "p2")
    # the same viewport with charts drawn compresses far worse than an empty page
    assert (tmp_path / "report.png").stat().st_size > 10 * (tmp_path / "blank.png").stat().st_size


def test_export_trace_one_process_per_rank_phases_nested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    two_ranks(tmp_path / "runs", monkeypatch)
    out = tmp_path / "trace.json"
    code, text, _ = run_cli("export-trace", str(tmp_path / "runs"), "-o", str(out), capsys=capsys)
    assert code == 0 and "trace events" in text
    trace = json.loads(out.read_text())
    events: list[dict[str, Any]] = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(n.split(" · ")[:2] for n in names.values()) == [
        ["rank 0", "run job-a"],
        ["rank 1", "run job-a"],
    ]
    spans = [e for e in events if e["ph"] == "X"]
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for e in spans:
        by_pid.setdefault(e["pid"], []).append(e)
    for pid, own in by_pid.items():
        loop = next(e for e in own if e["name"] == "training_loop")
        app = next(e for e in own if e["name"] == "application")
        iterations = [e for e in own if e["name"] == "training_iteration"]
        assert iterations, names[pid]
        for child in [loop, *iterations]:
            parent = app if child is loop else loop
            assert parent["ts"] <= child["ts"] and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"]
            assert child["tid"] == parent["tid"]
        step = 4 if names[pid].startswith("rank 0") else 5
        assert {e["dur"] for e in iterations} == {step * 1e6}
        assert all(len(e["args"]["span_id"]) == 16 for e in own)


def _tracks(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The complete events of each track (one process), by the track's name; each track's
    slices asserted to nest as Perfetto requires (one that overlaps without nesting is dropped)."""
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    tracks: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event["ph"] == "X":
            tracks.setdefault(names[event["tid"]], []).append(event)
    for name, slices in tracks.items():
        open_ends: list[int] = []
        for s in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= s["ts"]:
                open_ends.pop()
            assert not open_ends or s["ts"] + s["dur"] <= open_ends[-1], (name, s["name"], s["ts"])
            open_ends.append(s["ts"] + s["dur"])
    return tracks


def test_export_trace_nests_every_track_with_writers_windows_and_queued_saves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real job: an async save's writer thread marks its stages (as the docs advise) while
    training goes on, a second save queues behind the first (their background halves overlap),
    and windows of 3 iterations run across segments of 5. Before: all of it on one "training"
    track, where the writer's stages overlapped iterations and the windows the segments (7 and
    11 slices Perfetto would drop in two real runs), and the report gave the writer's stages a
    share of the wall time (52 % and 31 % beside 54 % for the iterations)."""
    import traintel
    from traintel.threads import ContextThreadPoolExecutor

    traintel.configure(
        span_exporters=[OtlpJsonFileSpanExporter(tmp_path / "job.otlp.jsonl")],
        metric_readers=[],
        export_iterations="all",
        log_every_n_iterations=3,
        segment_iterations=5,
    )
    second_saved = threading.Event()

    def write(completion: Any, wait: bool) -> None:
        with traintel.checkpoint_stage("write"):
            if wait:  # the first write lasts until the second save has returned to training
                second_saved.wait(30)
        with traintel.checkpoint_stage("upload"):
            pass
        completion.finish(size_bytes=10)

    with ContextThreadPoolExecutor(max_workers=1, thread_name_prefix="writer") as pool:
        with traintel.application(), traintel.training_loop():
            for i in range(12):
                with traintel.training_iteration(samples=2):
                    with traintel.model_forward():
                        pass
                if i in (3, 6):
                    with traintel.checkpoint_save(strategy="async") as save:
                        with traintel.checkpoint_stage("staging"):
                            pass
                        pool.submit(write, save.completion(), i == 3)
                    if i == 6:
                        second_saved.set()
    traintel.shutdown(5)

    code, text, _ = run_cli("export-trace", str(tmp_path), "-o", "-", capsys=capsys)
    assert code == 0
    tracks = _tracks(json.loads(text)["traceEvents"])
    names = {track: sorted({e["name"] for e in slices}) for track, slices in tracks.items()}
    assert names["thread writer_0"] == ["checkpoint_upload", "checkpoint_write"]
    assert names["windows"] == ["training_window"]
    assert names["background"] == names["background 2"] == ["checkpoint_finalize"]
    assert "checkpoint_staging" in names["training"] and "checkpoint_write" not in names["training"]
    assert len([e for e in tracks["training"] if e["name"] == "training_loop"]) == 3  # segments

    report = build_report([tmp_path])
    shares = {row["phase"]: row["share"] for row in report.as_dict()["phases"]}
    assert shares["checkpoint_write"] is None and shares["checkpoint_upload"] is None
    assert shares["checkpoint_staging"] is not None
    rows = dict(report.stage_rows())
    assert set(rows) == {
        "finalize (async writers, beside training)",
        "staging",
        "upload (writer threads, beside training)",
        "write (writer threads, beside training)",
    }


def test_export_trace_keeps_a_child_that_ends_with_its_parent_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An iteration that ends in the nanosecond its loop ends (as a shutdown ends both). Before:
    start and length in fractional microseconds, each rounded apart at today's epoch times (a
    double holds a quarter microsecond there), put the iteration's end past the loop's."""
    end = 20.000039595

    def together(job: Job) -> None:
        app = job.open("application", 0)
        loop = job.open("training_loop", 10, app)
        job.iteration(loop, 0, 10.000000685, end).end(end_time=at(end))
        loop.end(end_time=at(end))
        app.end(end_time=at(21))

    run_job(tmp_path, monkeypatch, together)
    code, text, _ = run_cli("export-trace", str(tmp_path), "-o", "-", capsys=capsys)
    slices = {e["name"]: e for e in _tracks(json.loads(text)["traceEvents"])["training"]}
    assert code == 0 and slices["training_iteration"]["ts"] == at(10.000000685) // 1000
    assert slices["training_iteration"]["ts"] + slices["training_iteration"]["dur"] == at(end) // 1000


def test_an_iteration_that_raised_is_not_the_slowest_iteration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 4 s step that hangs 100 s and raises (then the loop goes on): not a completed iteration,
    so not the table's max nor a slowest iteration (before: max 100 s beside a count and a mean
    of the 4 s steps); the errors name it."""

    def hung_then_raised(job: Job) -> None:
        app = job.open("application", 0)
        loop = job.open("training_loop", 0, app)
        t = 0.0
        for number in range(4):
            step = 100 if number == 2 else 4
            span = job.iteration(loop, number, t, t + step)
            if number == 2:
                span.set_status(trace.Status(trace.StatusCode.ERROR, "TimeoutError"))
            span.end(end_time=at(t + step))
            t += step
        loop.end(end_time=at(t))
        app.end(end_time=at(t))

    monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", "off")  # (a plain OpenTelemetry loop)
    run_job(tmp_path, monkeypatch, hung_then_raised)
    summary = summarize([tmp_path])
    row = next(r for r in phase_rows(summary) if r.phase == "training_iteration")
    assert (row.count, row.max_s, row.errors) == (3, pytest.approx(4), 1)
    assert {slow.iteration for slow in summary.slowest} == {0, 1, 3}
    assert [f.iteration for f in summary.failures.values()] == [2]


def test_plain_opentelemetry_iterations_after_one_that_raised_keep_their_own_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Iteration spans of the user's own, without numbers; the third raises. Before: the fourth
    got the third's number (the windows, which number them, do not count one that raised)."""

    def unnumbered(job: Job) -> None:
        loop = job.open("training_loop", 0)
        for n in range(4):
            span = job.open("training_iteration", 4 * n, loop)
            if n == 2:
                span.set_status(trace.Status(trace.StatusCode.ERROR, "ValueError"))
            span.end(end_time=at(4 * n + 4))
        loop.end(end_time=at(16))

    monkeypatch.setenv("TRAINTEL_WINDOW_EVENTS", "off")  # (a plain OpenTelemetry loop)
    run_job(tmp_path, monkeypatch, unnumbered)
    summary = summarize([tmp_path])
    assert {slow.iteration for slow in summary.slowest} == {0, 1, 3}
    assert [f.iteration for f in summary.failures.values()] == [2]


def test_export_trace_of_a_diverged_loss_is_strict_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A NaN loss on an iteration and on its window is written as the text ``"nan"`` (before:
    a bare ``NaN``, which is not JSON: Perfetto and chrome://tracing refused the whole file)."""

    def diverging(job: Job) -> None:
        app = job.open("application", 0)
        loop = job.open("training_loop", 0, app)
        for number in range(2):
            loss = {semconv.METRIC_PREFIX + "loss": float("nan") if number else 1.0}
            job.iteration(loop, number, number, number + 1, **loss).end(end_time=at(number + 1))
        loop.end(end_time=at(2))
        app.end(end_time=at(2))

    run_job(tmp_path, monkeypatch, diverging)
    code, text, _ = run_cli("export-trace", str(tmp_path), "-o", "-", capsys=capsys)

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    events = json.loads(text, parse_constant=refuse)["traceEvents"]
    losses = [
        e["args"].get(semconv.METRIC_PREFIX + "loss") for e in events if e["name"] == "training_iteration"
    ]
    assert code == 0 and sorted(losses, key=str) == [1.0, "nan"]


def test_compare_flags_the_slower_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINTEL_PERF_TAG", "p1")
    run_job(tmp_path / "a", monkeypatch, stepping(4))
    run_job(tmp_path / "b", monkeypatch, stepping(5))
    code, out, _ = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json", capsys=capsys)
    data = json.loads(out)
    assert code == 0 and data["perf_tags"] == {"a": ["p1"], "b": ["p1"], "match": True}
    mean = next(d for d in data["differences"] if d["metric"] == "iteration time mean")
    assert (mean["a"], mean["b"], mean["change"], mean["verdict"]) == (
        pytest.approx(4), pytest.approx(5), pytest.approx(0.25), "worse"
    )  # fmt: skip
    assert data["regressions"] == ["iteration time mean"]
    # the same 13 s of overhead weighs less against longer steps: goodput 24/37 -> 30/43
    goodput = next(d for d in data["differences"] if d["metric"] == "goodput")
    assert (goodput["a"], goodput["b"], goodput["verdict"]) == (
        pytest.approx(24 / 37),
        pytest.approx(30 / 43),
        "better",
    )
    code, out, _ = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--fail-on-regression",
                           capsys=capsys)  # fmt: skip
    assert code == 1 and "worse" in out
    # a CI log of the page or the JSON alone says why the step failed (before: nothing)
    for extra in (["--json"], ["--html", str(tmp_path / "compare.html")]):
        code, out, err = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--fail-on-regression",
                                 *extra, capsys=capsys)  # fmt: skip
        assert (code, err) == (1, "traintel: --fail-on-regression: worse than A: iteration time mean\n")
    code, out, _ = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "a"), "--fail-on-regression",
                           capsys=capsys)  # fmt: skip
    assert code == 0 and "0 significant difference(s)" in out
    for threshold in ("inf", "-1"):  # inf flagged nothing: --fail-on-regression passed a 25 % slowdown
        with pytest.raises(SystemExit):
            cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--threshold", threshold])
        assert (
            f"argument --threshold: must be a finite number > 0 (a fraction: 0.05 is 5%), got '{threshold}'"
            in (capsys.readouterr().err)
        )


def test_compare_counts_each_run_s_iterations_and_names_one_that_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that crashed half-way is compared with one that completed: its faster means read
    as a win, with no word that it ran half the iterations and failed."""
    from opentelemetry.trace import Status, StatusCode

    def crashing(job: Job) -> None:
        app = job.open("application", 0)
        loop = job.open("training_loop", 0, app)
        for number in range(3):
            job.iteration(loop, number, number, number + 1).end(end_time=at(number + 1))
        for span in (loop, app):
            span.record_exception(RuntimeError("CUDA error: an illegal memory access"), timestamp=at(3))
            span.set_status(Status(StatusCode.ERROR, "RuntimeError: CUDA error: an illegal memory access"))
            span.end(end_time=at(3))

    run_job(tmp_path / "a", monkeypatch, stepping(4))
    run_job(tmp_path / "b", monkeypatch, crashing)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    code, out, _ = run_cli("compare", a, b, "--json", capsys=capsys)
    data = json.loads(out)
    iterations = next(d for d in data["differences"] if d["metric"] == "iterations")
    assert (iterations["a"], iterations["b"], iterations["verdict"]) == (6, 3, "")  # neither better nor worse
    assert data["endings"] == ["completed", "failed (RuntimeError: CUDA error: an illegal memory access)"]
    code, out, _ = run_cli("compare", a, b, capsys=capsys)
    said = " ".join(out.split())
    assert (
        code == 0 and "not completed: B failed (RuntimeError: CUDA error: an illegal memory access)" in said
    )
    assert re.search(r"iterations +6 +3 +-50\.0% *\n", out)


def test_compare_warns_when_perf_tags_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINTEL_PERF_TAG", "p1")
    run_job(tmp_path / "a", monkeypatch, stepping(4))
    monkeypatch.setenv("TRAINTEL_PERF_TAG", "p2")
    run_job(tmp_path / "b", monkeypatch, stepping(4))
    code, out, _ = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), capsys=capsys)
    assert code == 0 and "perf tags differ" in out


def test_compare_and_export_trace_of_a_file_without_spans_fail_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A candidate whose file is empty or not OTLP is an error naming it, as ``report`` says
    (before: exit 0, every figure of B "-", "0 significant difference(s)": a CI gate with
    ``--fail-on-regression`` passed a run that wrote nothing); a trace of it too (before: an
    empty trace and exit 0)."""
    run_job(tmp_path / "a", monkeypatch, stepping(4))
    empty, other = tmp_path / "empty.otlp.jsonl", tmp_path / "other.jsonl"
    empty.touch()
    other.write_text('{"a": 1}\n')
    a = str(tmp_path / "a")
    for b, why in ((empty, ""), (other, ": 1 unreadable line(s), e.g. ")):
        code, _, err = run_cli("export-trace", str(b), "-o", str(tmp_path / "trace.json"), capsys=capsys)
        assert code == 1 and err.startswith(f"traintel: no readable spans in {b}{why}")  # as report says
        for extra in ([], ["--json"], ["--fail-on-regression"]):
            code, out, err = run_cli("compare", a, str(b), *extra, capsys=capsys)
            assert (code, out) == (1, "") and err.startswith(f"traintel: no readable spans in {b}{why}")


def test_compare_of_four_runs_shows_every_figure_whole_at_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four runs side by side in a pipe (80 columns): every value and every change against A as
    ``--json`` has it, none cut (before: a column per change, and the values read "4.0…",
    "+12…")."""
    for name, step in (("a", 4), ("b", 5), ("c", 4), ("d", 6)):
        run_job(tmp_path / name, monkeypatch, stepping(step), run_id=f"run-{name}", session=f"run-{name}")
    monkeypatch.setenv("COLUMNS", "80")
    paths = [str(tmp_path / name) for name in "abcd"]
    code, out, _ = run_cli("compare", *paths, capsys=capsys)
    assert code == 0 and "…" not in out and max(map(len, out.splitlines())) <= 80
    code, data, _ = run_cli("compare", *paths, "--json", capsys=capsys)
    mean = next(d for d in json.loads(data)["differences"] if d["metric"] == "iteration time mean")
    assert mean["values"] == [4, 5, 4, 6]
    assert re.search(r"iteration time mean +4\.00 s +5\.00 s +4\.00 s +6\.00 s +B worse, D worse", out)
    assert re.search(r"\n +vs A +\+25\.0% +\+0\.0% +\+50\.0% *\n", out)


def test_series_memory_is_bounded_and_totals_exact() -> None:
    series = Series(capacity=64)
    for n in range(100_000):
        series.add(WindowPoint(2 * n, 2 * n + 1, 2, n, time_s=2.0 + (n % 3), p99_s=1.0 + n % 7, samples=64.0))
    points = series.all()
    assert len(points) <= 64
    assert sum(p.iterations for p in points) == 200_000
    assert sum(p.time_s for p in points) == pytest.approx(sum(2.0 + (n % 3) for n in range(100_000)))
    assert sum(p.samples or 0 for p in points) == 64.0 * 100_000
    assert points[0].first_iteration == 0 and points[-1].last_iteration == 199_999
    assert max(p.p99_s for p in points) == 7.0
    # contiguous and ordered
    assert all(a.last_iteration + 1 == b.first_iteration for a, b in itertools.pairwise(points))


def test_cross_rank_tables_merged_file_by_file_count_what_one_table_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Files merged in order keep the same windows and count the same events dropped as one
    table that read every event: the events of a window a merge has no room for count."""
    from traintel.analysis import ranks

    monkeypatch.setattr(ranks, "MAX_WINDOWS", 3)
    update, live = semconv.Event.TRAINING_METRICS_UPDATE.value, semconv.Event.RANKS_METRICS_UPDATE.value
    W, R = semconv.WINDOW_PREFIX, semconv.RANKS_PREFIX

    def events(indices: range, rank: int) -> list[tuple[str, dict[str, Any]]]:
        window = [(update, {W + "index": i, W + "iteration_time.mean": 1.0 + rank}) for i in indices]
        return window + [(live, {R + "window.index": i}) for i in indices]

    files = [(0, events(range(0, 2), 0)), (1, events(range(1, 5), 1)), (0, events(range(3, 6), 0))]
    whole, merged = ranks.CrossRankTable(), ranks.CrossRankTable()
    for rank, file in files:
        part = ranks.CrossRankTable()
        for table in (whole, part):
            for name, attributes in file:
                table.add_event("job", rank, name, attributes)
        merged.merge(part)
    assert sorted(merged.windows) == sorted(whole.windows) == [("job", 0), ("job", 1), ("job", 2)]
    assert merged.dropped == whole.dropped == 2 * 2 + 3 * 2
    assert merged.rows() == whole.rows()


def test_the_cross_rank_table_says_it_shows_the_last_20_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """25 windows of two ranks: the terminal table shows the last 20 and says so (before: 20
    rows and nothing said, read as the whole run's); ``--json`` has every one."""
    run_job(tmp_path, monkeypatch, stepping(1, iterations=50), rank=0)
    run_job(tmp_path, monkeypatch, stepping(2, iterations=50), rank=1)
    report = build_report([tmp_path])
    assert [w["window"] for w in report.as_dict()["cross_rank"]["windows"]] == list(range(25))
    text = render_text(report)
    assert "the last 20 of 25 windows (each: --json)" in text
    shown = re.findall(r"^ (\d+) +(\d+)-(\d+) +2 ", text, re.M)
    assert shown == [(str(w), str(2 * w), str(2 * w + 1)) for w in range(5, 25)]


@pytest.mark.process
def test_report_memory_does_not_grow_with_the_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The streaming pass keeps bounded state: an input 10x larger needs about the same memory
    (peak RSS of a process that only builds the report)."""
    run_job(tmp_path / "run", monkeypatch, stepping(0.01, 400), window=2)
    (source,) = (tmp_path / "run").iterdir()
    lines = source.read_bytes()
    (tmp_path / "small").mkdir()
    (tmp_path / "large").mkdir()
    (tmp_path / "small" / source.name).write_bytes(lines)
    (tmp_path / "large" / source.name).write_bytes(lines * 10)  # ten runs' worth of windows

    def peak_rss_kb(directory: Path) -> int:
        code = (
            "import resource, sys\n"
            "from traintel.analysis.report import build_report\n"
            "r = build_report([sys.argv[1]], with_goodput=False)\n"
            "assert r.stats.skipped == 0\n"
            "assert sum(p.iterations for p in r.processes['job-a/0/0'].timing()) > 0\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(directory)], capture_output=True, text=True, check=True
        )
        return int(done.stdout.strip())

    small, large = peak_rss_kb(tmp_path / "small"), peak_rss_kb(tmp_path / "large")
    # holding the input would cost several times its 10 x ~0.8 MB of JSON in Python objects
    assert large - small < 8 * 1024, (small, large, len(lines))


def test_an_async_save_s_background_write_is_said_to_be_beside_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A save that blocks 1 s and whose writer runs 8 s beside the next iterations: the table of
    blocking times (total 1 s) listed the writer's 8 s as a bare "stage finalize", as if training
    had waited for it; its row now says whose time it is (text and HTML)."""
    from tests.test_goodput import job_with_async_save

    run_job(tmp_path, monkeypatch, job_with_async_save)
    code, out, _err = run_cli("report", str(tmp_path), capsys=capsys)
    assert code == 0
    table = out[out.index("Checkpoints (blocking time)") :].split("\n\n")[0]
    rows = {" ".join(line.split()[:-2]): line.split()[-2:] for line in table.splitlines()[2:]}
    assert rows["total"] == ["1.00", "s"]
    assert rows["stage finalize (async writers, beside training)"] == ["8.00", "s"]
    html = tmp_path / "report.html"
    assert run_cli("report", str(tmp_path), "--html", str(html), capsys=capsys)[0] == 0
    assert "<td>finalize (async writers, beside training)</td><td>8.00 s</td>" in html.read_text()


def test_report_checkpoints_say_they_are_summed_over_the_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ranks saving once each (2 s, 1 MB): the report's table counts every save of every
    rank (2), and now says so, as its phase table does (before: "saves 2" under a bare title,
    while the summary's line, its loop's, says "Checkpoints of rank 0: 1 save" and the guide
    said the report's checkpoint figures were the latest job's)."""
    two_ranks(tmp_path, monkeypatch)
    code, out, _err = run_cli("report", str(tmp_path), capsys=capsys)
    assert code == 0
    table = out[out.index("Checkpoints") :].splitlines()
    assert table[0].strip() == "Checkpoints (blocking time), summed over the 2 ranks"
    rows = {line.split()[0]: line.split()[1:] for line in table[2:7] if line.strip()}
    assert (rows["saves"], rows["total"]) == (["2"], ["4.00", "s"])
    code, out, _err = run_cli("report", str(tmp_path), "--json", capsys=capsys)
    checkpoints = json.loads(out)["checkpoints"]
    assert (checkpoints["saves"], checkpoints["bytes_total"]) == (2, 2_000_000)
    assert checkpoints["summed_over"] == {"jobs": 1, "ranks": 2}


def async_saving(job: Job) -> None:
    """Ten 1 s iterations; after the 3rd and the 6th an async save: 0.5 s blocking, then a 2.5 s
    background write beside the next iterations, whose size the writer gave at its finish."""
    app = job.open("application", 0)
    loop = job.open("training_loop", 0, app)
    t = 0.0
    for n in range(10):
        job.iteration(loop, n, t, t + 1).end(end_time=at(t + 1))
        t += 1
        if n in (2, 5):
            job.span("checkpoint_save_async", t, t + 0.5, loop, **{semconv.CHECKPOINT_ITERATION: n + 1})
            job.span(
                "checkpoint_finalize", t + 0.5, t + 3, loop, **{semconv.CHECKPOINT_SIZE: 4_000 * (n + 1)}
            )
            t += 0.5
    loop.end(end_time=at(t))
    app.end(end_time=at(t))


def test_async_saves_count_the_bytes_their_writers_gave_and_their_background_time_has_no_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async save's size is known when its writer finishes (on ``checkpoint_finalize``): the
    report's bytes count it (before: 0 bytes), and the background write, which runs beside
    training, gets no share of the wall time (before: 2 saves x 2.5 s of 11 s read 45 %, and
    more saves read over 100 %)."""
    run_job(tmp_path, monkeypatch, async_saving)
    report = build_report([tmp_path])
    assert report.checkpoints()["bytes_total"] == 12_000 + 24_000
    rows = {row.phase: row for row in phase_rows(report.summary)}
    assert (rows["checkpoint_finalize"].count, rows["checkpoint_finalize"].total_s) == (2, 5.0)
    assert rows["checkpoint_finalize"].share is None
    assert rows["checkpoint_save_async"].share == pytest.approx(1.0 / 11.0)


def saving(saves: int) -> Callable[[Job], None]:
    """One 1 s iteration then one save after another: save n lasts 0.5 s x (n % 4 + 1) and
    writes 1,000 x (n + 1) bytes."""

    def build(job: Job) -> None:
        app = job.open("application", 0)
        loop = job.open("training_loop", 0, app)
        job.iteration(loop, 0, 0, 1).end(end_time=at(1))
        t = 1.0
        for n in range(saves):
            seconds = 0.5 * (n % 4 + 1)
            attributes = {semconv.CHECKPOINT_ITERATION: n, semconv.CHECKPOINT_SIZE: 1_000 * (n + 1)}
            job.span("checkpoint_save_sync", t, t + seconds, loop, **attributes)
            t += seconds
        loop.end(end_time=at(t))
        app.end(end_time=at(t))

    return build


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.process
def test_checkpoint_totals_count_every_save_past_the_kept_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Two ranks of 260 saves each: 520, more than the 500 save records the chart keeps; the
    totals count them all, read in one process or two (merged)."""
    for rank in (0, 1):
        run_job(tmp_path, monkeypatch, saving(260), rank=rank)
    report = build_report([tmp_path], workers=workers)
    assert len(report.saves) == report_module.CHECKPOINT_RECORDS == 500
    checkpoints = report.as_dict()["checkpoints"]
    per_rank_seconds = sum(0.5 * (n % 4 + 1) for n in range(260))
    assert checkpoints["saves"] == 520
    assert checkpoints["save_time_total_s"] == pytest.approx(2 * per_rank_seconds, rel=1e-12)
    assert checkpoints["save_time_mean_s"] == pytest.approx(per_rank_seconds / 260, rel=1e-12)
    assert checkpoints["save_time_max_s"] == 2.0
    assert checkpoints["bytes_total"] == 2 * 1_000 * sum(range(1, 261))
    assert "the first 60 of 520 saves" in render_html(report)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_compare_html_overlays_the_runs_and_tables_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, step, batch in (("a", 4, 8), ("b", 5, 16), ("c", 4, 8)):
        config = {"global_batch_size": batch, "log_every_n_iterations": 2}
        run_job(
            tmp_path / name,
            monkeypatch,
            stepping(step, config=config),
            run_id=f"run-{name}",
            session=f"run-{name}",
        )
    page = tmp_path / "compare.html"
    paths = [str(tmp_path / name) for name in "abc"]
    code, out, _ = run_cli("compare", *paths, "--html", str(page), capsys=capsys)
    assert code == 0 and out.strip() == f"HTML comparison: {page}"  # the page, not the tables again
    html = page.read_text()
    assert "<script" not in html and "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    rows = re.findall(r"<tr><td class=\"name\">(.*?)</tr>", html)
    assert len(rows) == 3 and all(f"run-{name}" in row for name, row in zip("abc", rows, strict=True))
    # the setting that differs, named in each run's row and highlighted in the configuration
    assert [
        re.search(r"global_batch_size = \d+", row)[0]
        for row in rows  # type: ignore[index]
    ] == ["global_batch_size = 8", "global_batch_size = 16", "global_batch_size = 8"]
    assert re.search(r"<tr class=diff><td>global_batch_size</td><td>8</td><td>16</td><td>8</td></tr>", html)
    assert "<tr><td>log_every_n_iterations</td><td>2</td><td>2</td><td>2</td></tr>" in html
    # iteration time: one line per run, B slower (worse, in red), C the same as A
    curve = re.search(r'<svg id="curve-0".*?</svg>', html, re.S)
    assert curve is not None and curve[0].count('class="series"') == 3
    assert "<title>B: iterations 0-1: 5.00 s</title>" in curve[0]  # the tooltips as the report's
    mean_row = re.search(r"<tr><td>iteration time mean</td>(.*?)</tr>", html)
    assert mean_row is not None and 'class="worse"' in mean_row[1] and "+25.0%" in mean_row[1]
    assert html.count('<rect class="bar"') >= 3  # a goodput bar per run
    code, out, _ = run_cli("compare", *paths, "--json", capsys=capsys)
    data = json.loads(out)
    assert data["runs"]["all"] == ["run-a", "run-b", "run-c"]
    mean = next(d for d in data["differences"] if d["metric"] == "iteration time mean")
    assert mean["values"] == [pytest.approx(4), pytest.approx(5), pytest.approx(4)]
    assert mean["verdicts"] == ["", "worse", ""] and data["regressions"] == ["iteration time mean"]
    assert data["config_differences"] == {"global_batch_size": [8, 16, 8]}


def test_trace_ids_link_into_the_trace_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_job(tmp_path, monkeypatch, stepping(4))
    monkeypatch.setenv("TRAINTEL_TRACE_URL", "http://localhost:16686/trace/{trace_id}?uiFind={span_id}")
    trace_id, span_id = build_report([tmp_path]).summary.slowest[0][1:3]
    url = f"http://localhost:16686/trace/{trace_id}?uiFind={span_id}"
    page = tmp_path / "report.html"
    assert run_cli("report", str(tmp_path), "--html", str(page), capsys=capsys)[0] == 0
    assert f'<a href="{url}"><code>{trace_id}</code></a>' in page.read_text()
    for command in ("report", "summary", "goodput"):  # (the slowest tie at 4 s: any of their spans)
        code, out, _ = run_cli(command, str(tmp_path), capsys=capsys)
        assert code == 0 and re.search(re.escape(url[:-16]) + r"[0-9a-f]{16}\n", out), command
    monkeypatch.setenv("TRAINTEL_TRACE_URL", "http://localhost:16686/trace/")
    code, _, err = run_cli("summary", str(tmp_path), capsys=capsys)
    assert code == 2 and "TRAINTEL_TRACE_URL must contain {trace_id}" in err


def test_report_html_has_a_configuration_panel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_job(tmp_path, monkeypatch, stepping(4, config={"global_batch_size": 32, "dtype": "bf16"}))
    page = tmp_path / "report.html"
    code, out, _ = run_cli("report", str(tmp_path), "--html", str(page), capsys=capsys)
    assert code == 0 and out.strip() == f"HTML report: {page}"
    html = page.read_text()
    assert "<h2>Configuration</h2>" in html and "<tr><td>global_batch_size</td><td>32</td></tr>" in html
    assert build_report([tmp_path]).as_dict()["config"]["global_batch_size"] == 32


def test_a_run_without_an_application_records_its_configuration(tmp_path: Path) -> None:
    """The configuration events went on the application span alone: a run of loops without
    ``application()`` had none (the report's configuration empty; ``compare`` listed every
    setting as differing). Its training loop carries them."""
    import traintel

    path = tmp_path / "loops.otlp.jsonl"
    traintel.configure(
        span_exporters=[OtlpJsonFileSpanExporter(path)], metric_readers=[], warmup_iterations=2
    )
    with traintel.training_loop():
        traintel.set_training_config(global_batch_size=32)
        with traintel.training_iteration():
            pass
    traintel.shutdown(5)
    config = build_report([tmp_path]).as_dict()["config"]
    assert (config["warmup_iterations"], config["global_batch_size"]) == (2, 32)


def test_summary_and_goodput_fit_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run ids are uuids, trace ids 32 hex digits: each gets a line of its own, never a wrap."""
    uuid = "0123456789abcdef0123456789abcdef"
    run_job(tmp_path, monkeypatch, stepping(4, iterations=12), run_id=uuid, session=uuid)
    for command in ("summary", "goodput"):
        code, out, _ = run_cli(command, str(tmp_path), capsys=capsys)
        wide = [line for line in out.splitlines() if len(line) > 80]
        assert code == 0 and not wide, f"{command}: {wide}"
        assert "trace " in out, command  # the ids are there, on lines of their own


def test_a_progress_mark_without_its_file_is_said_and_read_by_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job SIGKILLed in its first minute (the OOM killer, say) wrote its progress mark, never
    its spans (the file gathers them for 60 s). Every command said "goodput and report count its
    time from the mark", then "no telemetry files found" with exit 2; each now says the mark is
    there and reads the job from it, alone or beside its resumed job's file."""
    from traintel.exporters.progress_mark import MarkFile, mark_path

    killed = mark_path(tmp_path / "killed" / "train-1.otlp.jsonl")
    resource = {"service.name": "train", "service.instance.id": "i", semconv.RUN_ID: "r1", semconv.RANK: 0}
    mark = MarkFile()
    mark.write(killed, {
        "instance": "i", "time_unix_nano": 30 * 10**9, "start_unix_nano": 10**9, "resource": resource,
        "progress": {"first_iteration": 0, "last_iteration": 725, "iterations": 726},
    })  # fmt: skip
    mark.close()
    said = f"{killed}: a job at iteration 725 by its progress mark"
    code, out, err = run_cli("summary", str(killed.parent), capsys=capsys)
    assert code == 0 and said in err and "its time and iterations are counted from the mark" in err
    assert "Run: service train | run r1 | ranks [0]" in out and "Iterations: 726, to iteration 725" in out
    code, out, err = run_cli("runs", str(killed.parent), "--json", capsys=capsys)
    (run,) = json.loads(out)["runs"]
    assert code == 0 and said in err and (run["id"], run["iterations"], run["duration_s"]) == ("r1", 726, 29)
    code, out, err = run_cli("goodput", str(killed.parent), "--json", capsys=capsys)
    assert code == 0 and said in err and json.loads(out)["sessions"][0]["total_seconds"] == 29
    code, out, err = run_cli("report", str(killed.parent), "--json", capsys=capsys)
    report = json.loads(out)
    assert code == 0 and said in err and report["goodput"][0]["total_seconds"] == 29
    assert (report["identity"]["run_ids"], report["iterations"]["count"]) == (["r1"], 726)
    file = str(killed)[: -len(".progress")]  # as the job's first line named it: read too
    assert analysis_files(iter([killed.parent])) == [Path(file)]  # (paths read twice: a list made)
    big = tmp_path / "killed" / "big.otlp.jsonl"
    big.write_bytes(b"\n" * 100)
    with monkeypatch.context() as patched:
        patched.setattr(parallel, "PARALLEL_BYTES", 50)
        patched.setattr(os, "cpu_count", lambda: 4)
        # the file never written has no bytes, and does not make the reader give up on processes
        assert (parallel.input_bytes([str(big), file]), parallel.auto_workers([str(big), file])) == (100, 2)
    big.unlink()
    code, out, err = run_cli("summary", file, capsys=capsys)
    assert code == 0 and said in err and "Iterations: 726, to iteration 725" in out
    run_job(tmp_path / "killed", monkeypatch, stepping(4))  # its resume, in the same directory
    code, out, err = run_cli("goodput", str(killed.parent), capsys=capsys)
    assert code == 0 and "session " in out and said in err


def test_goodput_shares_stand_in_one_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The goodput row and every badput row, the longest name (infrastructure_recovery)
    included, put their share in the same column; the report's iteration count is every
    iteration, its times and rates are after warm-up, and its title says which is which."""
    run_job(tmp_path, monkeypatch, stepping(4, iterations=12))
    code, out, _ = run_cli("goodput", str(tmp_path), capsys=capsys)
    rows = [line for line in out.splitlines() if line.startswith(("  goodput ", "  badput "))]
    assert code == 0 and len(rows) == 1 + len(semconv.BADPUT_CATEGORIES)
    assert len({line.index("%") for line in rows}) == 1, rows
    code, out, _ = run_cli("report", str(tmp_path), capsys=capsys)
    assert code == 0 and "Iterations and throughput (times and rates after warm-up)" in out
    assert re.search(r"\n iterations +12 \n", out), out


def test_the_commands_read_the_default_directory_and_trace_goes_to_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_job(tmp_path / "traintel-runs", monkeypatch, stepping(4))
    monkeypatch.delenv("TRAINTEL_OUTPUT_DIR")
    monkeypatch.chdir(tmp_path)  # where the job ran: ./traintel-runs is what it wrote
    for command in ("summary", "goodput", "report", "runs"):
        code, out, err = run_cli(command, capsys=capsys)
        assert code == 0 and ("job-a" in out or "1 run in traintel-runs" in out), (command, err)
    monkeypatch.setenv("TRAINTEL_OUTPUT_DIR", str(tmp_path / "elsewhere"))
    code, _, err = run_cli("summary", capsys=capsys)
    assert code == 2 and "elsewhere" in err
    code, out, err = run_cli("export-trace", str(tmp_path / "traintel-runs"), "-o", "-", capsys=capsys)
    assert code == 0 and not (tmp_path / "-").exists()
    assert json.loads(out)["traceEvents"] and "trace events to standard output" in err


def _write_counters(path: Path, instance: str, exports: list[dict[str, int]]) -> None:
    """One process's file through the real SDK and file exporters: a span, and traintel counters
    whose cumulative values at each export (what a process writes every interval) ``exports`` gives."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from traintel.exporters.file import (
        OtlpJsonFileMetricExporter,
        OtlpJsonFileSpanExporter,
        OtlpJsonLinesFile,
    )

    same_job = {semconv.RUN_ID: "r1", semconv.RESTART_COUNT: 0, semconv.RANK: 0}
    resource = Resource({"service.name": "job", semconv.SERVICE_INSTANCE_ID: instance, **same_job})
    file = OtlpJsonLinesFile(path=path)
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileSpanExporter(file=file)))
    tracer_provider.get_tracer("job").start_span("work", start_time=1_000, attributes={}).end(end_time=2_000)
    reader = PeriodicExportingMetricReader(
        OtlpJsonFileMetricExporter(file=file), export_interval_millis=3_600_000
    )
    provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
    counters = {name: provider.get_meter("traintel").create_counter(name) for name in exports[0]}
    added = dict.fromkeys(exports[0], 0)
    for values in exports:
        for name, value in values.items():
            counters[name].add(value - added[name])
            added[name] = value
        assert provider.force_flush()
    provider.shutdown()
    tracer_provider.shutdown()


def test_report_and_summary_count_each_process_s_counters_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two processes with the same run id, restart and rank (a job relaunched by hand with the same
    TRAINTEL_RUN_ID, its files read together) but their own service.instance.id: a counter is
    cumulative per process, so each process's last value counts once and the processes add up
    (spans 5 + 7, events 2 + 4), in ``traintel report`` as in ``traintel summary``."""
    spans, events = semconv.METRIC_SPANS_DROPPED, semconv.METRIC_EVENTS_DROPPED
    _write_counters(tmp_path / "a.otlp.jsonl", "instance-a", [{spans: 3, events: 1}, {spans: 5, events: 2}])
    _write_counters(tmp_path / "b.otlp.jsonl", "instance-b", [{spans: 7, events: 4}])
    expected = {events: 6.0, spans: 12.0}
    assert summarize([tmp_path]).self_telemetry == expected
    assert build_report([tmp_path]).summary.self_telemetry == expected
    assert cli.main(["report", "--json", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["self_telemetry"] == expected
    assert cli.main(["summary", str(tmp_path)]) == 0
    assert "Telemetry losses: traintel.events.dropped 6, traintel.spans.dropped 12" in capsys.readouterr().out


@pytest.mark.process
def test_a_counter_split_by_an_attribute_is_read_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``traintel.iterations.exported`` counts every iteration, split by ``traintel.exported``:
    the report gives the total and each part, the exported part being the iteration spans the
    file holds (the process's own figures), the rest not exported."""
    from tests.subprocess_helpers import run_python
    from traintel.exporters.reader import iter_records

    code = """
    import traintel
    with traintel.application():
        with traintel.training_loop():
            for i in range(40):
                with traintel.training_iteration(samples=4):
                    pass
    """
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    runs = tmp_path / "traintel-runs"
    spans = sum(
        1 for r in iter_records([runs]) if getattr(r, "name", None) == semconv.Phase.TRAINING_ITERATION.value
    )
    assert 0 < spans < 40
    name = semconv.METRIC_ITERATIONS_EXPORTED
    assert cli.main(["report", "--json", str(runs)]) == 0
    telemetry = json.loads(capsys.readouterr().out)["self_telemetry"]
    assert {key: value for key, value in telemetry.items() if key.startswith(name)} == {
        name: 40,
        name + "{traintel.exported=false}": 40 - spans,
        name + "{traintel.exported=true}": spans,
    }
