"""Several runs in one directory, kept apart: ``traintel runs``, ``summary``/``report`` of the
newest run by default (a note names the others), ``--run ID``, ``--all``, ``compare``.

The input is what a user's ``./traintel-runs`` collects: real jobs run one after the other, two
single-process jobs around a 2-rank job (gloo on 127.0.0.1, one file per rank). Every run's
report read from the shared directory must equal the report of its own files alone, and the
2-rank job must stay one run. Model metrics recorded with ``record_metrics`` are checked to the
exact window means, in the summary, the JSON report and the HTML page's tooltips; the terminal
report is checked at 80 columns through a real pipe.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.rank_helpers import run_ranks
from tests.subprocess_helpers import clean_env, run_python
from tests.test_goodput import run_job
from tests.test_report import stepping
from traintel import cli
from traintel.analysis.report import MetricPoint, Series, build_report
from traintel.analysis.runs import scan_runs, single_run
from traintel.analysis.summary import phase_rows, plain_number, render, summarize
from traintel.exporters.reader import iter_spans

pytestmark = [pytest.mark.process, pytest.mark.xdist_group("ranks")]  # the suite's tiers: tests/tiers.py

#: A single-process job: ITERATIONS iterations in windows of 5, a loss falling as 1/(i+1).
SOLO_JOB = """
import traintel
with traintel.application():
    with traintel.model_init():
        pass
    with traintel.training_loop():
        for i in range(ITERATIONS):
            with traintel.training_iteration(samples=8):
                with traintel.model_forward():
                    sum(range(1000))
                traintel.record_metrics(loss=1.0 / (i + 1), lr=0.001)
traintel.shutdown()
"""

#: Two ranks of one job (torchrun gives both the same run id): 12 iterations in windows of 4,
#: each rank its own loss, so the charts tell the ranks apart.
RANK_JOB = """
x = torch.randn(8, 16)
with traintel.application():
    with traintel.training_loop():
        for i in range(12):
            with traintel.training_iteration(samples=8):
                with traintel.model_forward():
                    (x @ x.T).sum()
                traintel.record_metrics(loss=(RANK + 1) / (i + 1), grad_norm=0.5 * i)
traintel.shutdown()
dist.destroy_process_group()
"""


@dataclass
class Runs:
    """The shared directory and, per run, its own files apart and its id."""

    shared: Path
    own: dict[str, Path]  # "old", "ddp", "new" -> a directory holding only that run's files
    ids: dict[str, str]


def _run_id(directory: Path) -> str:
    (run_id,) = {str(span.resource["ml.training.run_id"]) for span in iter_spans([directory])}
    return run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    tmp = tmp_path_factory.mktemp("runs")
    shared = tmp / "traintel-runs"
    own = {"old": tmp / "old", "ddp": tmp / "ddp", "new": tmp / "new"}
    for name, iterations in (("old", 10), ("ddp", 0), ("new", 20)):
        if name == "ddp":
            (tmp / "ddp-job").mkdir()
            results = run_ranks(RANK_JOB, tmp / "ddp-job", TRAINTEL_LOG_EVERY_N_ITERATIONS="4")
            for result in results:
                assert result.returncode == 0, result.stderr[-3000:]
                shutil.copytree(result.out_dir, own["ddp"] / result.out_dir.name)
        else:
            job = run_python(
                SOLO_JOB.replace("ITERATIONS", str(iterations)),
                tmp,
                TRAINTEL_OUTPUT_DIR=str(own[name]),
                TRAINTEL_LOG_EVERY_N_ITERATIONS="5",
                TRAINTEL_WARMUP_ITERATIONS="0",
            )
            assert job.returncode == 0, job.stderr
        for file in own[name].rglob("*.otlp.jsonl"):
            shared.mkdir(exist_ok=True)
            shutil.copy(file, shared / f"{name}-{file.parent.name}-{file.name}")
    return Runs(shared, own, {name: _run_id(path) for name, path in own.items()})


def _cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_runs_lists_each_run_once_newest_first(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli("runs", str(runs.shared), "--json", capsys=capsys)
    assert code == 0
    listed = json.loads(out)["runs"]
    assert [r["id"] for r in listed] == [runs.ids["new"], runs.ids["ddp"], runs.ids["old"]]
    # the 2-rank job is one run: both ranks, both files, each rank's 12 iterations counted once
    assert [(r["ranks"], r["iterations"], len(r["files"]), r["restarts"]) for r in listed] == [
        ([0], 20, 1, 0), ([0, 1], 12, 2, 0), ([0], 10, 1, 0)
    ]  # fmt: skip
    code, out, _ = _cli("runs", str(runs.shared), capsys=capsys)
    lines = out.splitlines()
    assert lines[0] == f"3 runs in {runs.shared}, newest first:"
    assert lines[2].split() == [
        "run",
        "service",
        "started",
        "(UTC)",
        "duration",
        "ranks",
        "iterations",
        "files",
    ]
    for line, name, ranks, iterations, files in zip(
        lines[3:6], ("new", "ddp", "old"), (1, 2, 1), (20, 12, 10), (1, 2, 1), strict=True
    ):
        cells = line.split()
        assert runs.ids[name].startswith(cells[0]) and len(cells[0]) >= min(12, len(runs.ids[name]))
        assert cells[-3:] == [str(ranks), str(iterations), str(files)]
    assert all(len(line) <= 80 for line in lines[1:])  # the first names the directory: its path's length


def _body(text: str) -> str:
    """A summary without the note that precedes it."""
    return text[text.index("Run: ") :]


def test_summary_shows_the_newest_run_alone_and_names_the_others(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli("summary", str(runs.shared), capsys=capsys)
    assert code == 0
    note = " ".join(out[: out.index("Run: ")].split())
    short = {name: run_id[:12] for name, run_id in runs.ids.items()}
    assert note.startswith(f"Showing the newest of 3 runs in {runs.shared}: {short['new']}, started ")
    assert f"Other runs: {short['ddp']}, {short['old']}. Pick one with --run ID" in note
    assert f"traintel runs {runs.shared}" in note
    # exactly what the newest run's own files say: nothing of the others added in
    assert _body(out) == render(summarize([runs.own["new"]])) + "\n"
    assert f"run {runs.ids['new']} |" in out and runs.ids["old"] not in _body(out)
    rows = {row.phase: row for row in phase_rows(summarize([runs.shared], run=runs.ids["new"]))}
    assert rows["training_iteration"].count == 20 and rows["training_loop"].count == 1
    assert "Iterations: 20 " in out
    # the last window is iterations 15-19: loss 1/16..1/20, summed as the aggregator sums them
    losses = [1.0 / (i + 1) for i in range(15, 20)]
    mean = plain_number(sum(losses) / len(losses))
    assert f"Model metrics, last window (iterations 15-19): loss 0.05 (mean {mean}), lr 0.001" in out


def test_the_full_read_names_the_runs_as_the_scan_does(runs: Runs) -> None:
    """``summary`` and ``report`` note every run they read through: the same runs, files,
    ranks, times and iterations as ``traintel runs`` lists, serially and in two processes."""
    listed = [run.as_dict() for run in scan_runs([runs.shared])]
    assert len(listed) == 3
    assert [run.as_dict() for run in scan_runs([runs.shared], workers=2)] == listed
    for workers in (1, 2):
        assert [
            run.as_dict() for run in summarize([runs.shared], workers=workers).runs.newest_first()
        ] == listed
        report = build_report([runs.shared], workers=workers)
        assert [run.as_dict() for run in report.summary.runs.newest_first()] == listed
    # the workers report the bytes they read (batched): the progress bar reaches the total
    size = sum(path.stat().st_size for path in runs.shared.iterdir())
    for workers in (1, 2):
        read: list[int] = []
        scan_runs([runs.shared], progress=read.append, workers=workers)
        assert sum(read) == size, workers


def test_single_run_is_told_from_the_first_lines(runs: Runs, tmp_path: Path) -> None:
    def files(*directories: Path) -> list[str]:
        return sorted(str(p) for d in directories for p in d.rglob("*.otlp.jsonl"))

    assert single_run(files(runs.own["new"])) == runs.ids["new"]
    assert single_run(files(runs.own["ddp"])) == runs.ids["ddp"]  # both ranks: one run
    assert single_run(files(runs.shared)) is None
    (tmp_path / "empty.otlp.jsonl").write_bytes(b"\n\n")  # holds no run: left out
    assert single_run([str(tmp_path / "empty.otlp.jsonl"), *files(runs.own["new"])]) == runs.ids["new"]
    (tmp_path / "bad.otlp.jsonl").write_bytes(b"{not json\n")
    assert single_run([str(tmp_path / "bad.otlp.jsonl"), *files(runs.own["new"])]) is None


def test_one_run_is_read_once(
    runs: Runs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files that start with one run and hold only it are read once: no scan first."""

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("scanned before reading")

    monkeypatch.setattr(cli, "scan_runs", no_scan)
    for command in ("summary", "report"):
        code, out, err = _cli(command, str(runs.own["ddp"]), capsys=capsys)
        assert code == 0 and "Showing the newest" not in out + err, err
    code, out, _ = _cli("summary", str(runs.own["new"]), capsys=capsys)
    assert out == render(summarize([runs.own["new"]])) + "\n"


def test_a_newer_run_met_later_in_a_file_is_the_one_shown(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A collector's file that starts with the old run and holds the new one after it: the one
    read finds both, and the newest is shown, alone, with the note naming the other."""
    mixed = tmp_path / "collector"
    mixed.mkdir()
    lines = b"".join(
        p.read_bytes() for name in ("old", "new") for p in sorted(runs.own[name].rglob("*.otlp.jsonl"))
    )
    (mixed / "node-0.otlp.jsonl").write_bytes(lines)
    assert single_run([str(mixed / "node-0.otlp.jsonl")]) == runs.ids["old"]
    code, out, _ = _cli("summary", str(mixed), capsys=capsys)
    assert code == 0
    note = " ".join(out[: out.index("Run: ")].split())
    assert note.startswith(f"Showing the newest of 2 runs in {mixed}: {runs.ids['new'][:12]}, started ")
    assert _body(out) == render(summarize([runs.own["new"]])) + "\n"
    code, out, err = _cli("report", str(mixed), "--json", capsys=capsys)
    data = json.loads(out)
    assert data["iterations"]["count"] == 20 and data["other_runs"] == [runs.ids["old"]]
    assert "Showing the newest of 2 runs" in err


def test_summary_run_selects_by_prefix_and_keeps_the_ranks_together(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    ddp = runs.ids["ddp"]
    code, out, _ = _cli("summary", str(runs.shared), "--run", ddp[:8], capsys=capsys)
    assert code == 0 and out.startswith("Run: ")  # chosen: no note
    assert out == render(summarize([runs.own["ddp"]])) + "\n"
    assert "ranks [0, 1]" in out and "summed over the 2 ranks" in out
    alone = {r.phase: (r.count, r.total_s) for r in phase_rows(summarize([runs.own["ddp"]]))}
    shared = {r.phase: (r.count, r.total_s) for r in phase_rows(summarize([runs.shared], run=ddp))}
    assert shared == alone and alone["training_iteration"][0] == 24  # 12 per rank
    assert alone["training_loop"][0] == 2 and alone["application"][0] == 2


def test_summary_all_has_one_section_per_run(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli("summary", str(runs.shared), "--all", capsys=capsys)
    assert code == 0
    sections = re.split(r"\n?=== (Run \d of 3: \S+) .*===\n", out)
    assert sections[0] == ""
    titles, bodies = sections[1::2], sections[2::2]
    assert titles == [f"Run {n} of 3: {runs.ids[name]}" for n, name in enumerate(("new", "ddp", "old"), 1)]
    for name, body in zip(("new", "ddp", "old"), bodies, strict=True):
        assert body == render(summarize([runs.own[name]])) + "\n"


def test_a_run_that_is_not_there_or_ambiguous_is_an_error(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli("summary", str(runs.shared), "--run", "no-such-run", capsys=capsys)
    assert code == 2 and out == ""
    assert err.startswith("traintel: no run 'no-such-run' in these files; the runs are: ")
    code, out, err = _cli("report", str(runs.shared), "--run", "", capsys=capsys)
    assert code == 2 and out == "" and "names 3 runs" in err and "give more of the id" in err
    with pytest.raises(SystemExit):
        cli.main(["summary", str(runs.shared), "--run", "x", "--all"])
    assert "not allowed with argument" in capsys.readouterr().err


def _phases(data: dict[str, Any]) -> dict[str, tuple[int, float]]:
    return {row["phase"]: (row["count"], row["total_s"]) for row in data["phases"]}


def test_report_json_is_the_chosen_run_alone(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli("report", str(runs.shared), "--json", capsys=capsys)
    assert code == 0
    data = json.loads(out)  # the note went to stderr: stdout is one JSON document
    assert "Showing the newest of 3 runs" in err
    assert data["run"] == runs.ids["new"] and data["other_runs"] == [runs.ids["ddp"], runs.ids["old"]]
    alone = build_report([runs.own["new"]]).as_dict()
    assert _phases(data) == _phases(alone)
    assert data["goodput"] == json.loads(json.dumps(alone["goodput"]))
    assert [s["session"] for s in data["goodput"]] == [runs.ids["new"]]
    code, out, _ = _cli("report", str(runs.shared), "--json", "--run", runs.ids["ddp"], capsys=capsys)
    data = json.loads(out)
    assert data["identity"]["ranks"] == [0, 1] and data["identity"]["run_ids"] == [runs.ids["ddp"]]
    assert _phases(data) == _phases(build_report([runs.own["ddp"]]).as_dict())
    assert len(data["windows"]) == 2 and [len(w) for w in data["windows"].values()] == [3, 3]
    assert [w["ranks"] for w in data["cross_rank"]["windows"]] == [2, 2, 2]
    code, out, _ = _cli("report", str(runs.shared), "--json", "--all", capsys=capsys)
    assert [r["run"] for r in json.loads(out)["runs"]] == [runs.ids[n] for n in ("new", "ddp", "old")]


def test_export_trace_is_the_chosen_run_alone(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``export-trace`` of a directory that keeps every run made from it wrote them all into
    one trace (jobs of different days side by side); it chooses as the other commands do."""

    def trace(*choice: str) -> tuple[str, set[str]]:
        out = tmp_path / "trace.json"
        code, said, _ = _cli("export-trace", str(runs.shared), "-o", str(out), *choice, capsys=capsys)
        assert code == 0
        events = json.loads(out.read_text())["traceEvents"]
        shown = {e["args"]["name"] for e in events if e["name"] == "process_name"}
        return said, {name.split(" · ")[1].removeprefix("run ") for name in shown}

    said, shown = trace()
    assert "Showing the newest of 3 runs" in said and shown == {runs.ids["new"][:8]}
    said, shown = trace("--run", runs.ids["ddp"])
    assert "Showing" not in said and shown == {runs.ids["ddp"][:8]}
    _, shown = trace("--all")
    assert shown == {runs.ids[name][:8] for name in ("new", "ddp", "old")}


def _window_means(rank: int) -> list[tuple[int, int, float, float]]:
    """(first, last, mean, last value) of the 2-rank job's loss per window of 4, as recorded."""
    out = []
    for first in (0, 4, 8):
        values = [(rank + 1) / (i + 1) for i in range(first, first + 4)]
        out.append((first, first + 3, sum(values) / len(values), values[-1]))
    return out


def test_report_json_has_the_model_metrics_per_window(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _cli("report", str(runs.shared), "--json", "--run", runs.ids["ddp"], capsys=capsys)
    metrics = json.loads(out)["model_metrics"]
    assert sorted(metrics) == ["grad_norm", "loss"]
    labels = sorted(metrics["loss"])
    assert [label.split(" · ")[0] for label in labels] == ["rank 0", "rank 1"]
    for rank, label in enumerate(labels):
        points = metrics["loss"][label]
        assert [(p["first_iteration"], p["last_iteration"], p["mean"], p["last"]) for p in points] == (
            _window_means(rank)
        )
        assert [p["last"] for p in metrics["grad_norm"][label]] == [1.5, 3.5, 5.5]


def test_html_draws_each_model_metric_with_tooltips(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "report.html"
    code, out, _ = _cli("report", str(runs.shared), "--run", runs.ids["ddp"], "--html", str(page),
                        capsys=capsys)  # fmt: skip
    assert code == 0 and f"HTML report: {page}" in out
    html = page.read_text()
    assert 'id="model-metric-0"' in html and 'id="model-metric-1"' in html  # grad_norm, loss
    label = f"run {runs.ids['ddp'][:8]}"
    for rank in (0, 1):
        for first, last, mean, value in _window_means(rank):
            tip = (
                f"rank {rank} · {label} · loss, iterations {first}-{last}: "
                f"mean {plain_number(mean)}, last {plain_number(value)}"
            )
            assert f"<title>{tip}</title></circle>" in html, tip
    # every point of the other charts has its numbers in a tooltip too
    assert re.search(
        rf"<title>rank 0 · {label} mean: iterations 0-3: [\d.]+ (µs|ms|s)</title></circle>", html
    )
    # --all writes one page per run
    code, out, _ = _cli("report", str(runs.shared), "--all", "--html", str(page), capsys=capsys)
    pages = [
        line.removeprefix("HTML report: ") for line in out.splitlines() if line.startswith("HTML report")
    ]
    assert pages == [str(tmp_path / f"report-{runs.ids[n][:12]}.html") for n in ("new", "ddp", "old")]
    assert all(Path(p).read_text().count("<svg") >= 4 for p in pages)


def test_report_at_80_columns_keeps_names_whole_and_numbers_plain(runs: Runs) -> None:
    """Through a real pipe, as in a CI log: rich takes the width from COLUMNS."""
    result = subprocess.run(
        [sys.executable, "-m", "traintel.cli", "report", str(runs.shared), "--run", runs.ids["ddp"]],
        env={**clean_env(), "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout
    assert not re.search(r"\d[eE][+-]\d", result.stdout)  # no scientific notation (2.132e+04)
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(" ") and line.split()}
    for phase in ("application", "training_loop", "training_iteration", "model_forward"):
        assert phase in rows, phase  # whole names, one row each: nothing wrapped
    assert rows["training_iteration"][1] == "24"
    assert any(line.startswith("Across ranks, per window") for line in lines)
    assert any(line.startswith("Model metrics") for line in lines)
    assert rows["loss"][1:3] == [plain_number(1 / 12), plain_number(_window_means(0)[-1][2])]


def test_plain_numbers_never_use_scientific_notation() -> None:
    values = (21323.4, 6341.5, 1_234_567.0, 12, 0.2583006, 3e-05, 0.0030000000000000022)
    assert [plain_number(v) for v in values] == [
        "21,323", "6,342", "1,234,567", "12", "0.2583", "0.00003", "0.003"
    ]  # fmt: skip
    assert [plain_number(v) for v in (0.0, -2.5, 999.96, float("nan"), None)] == [
        "0",
        "-2.5",
        "1,000",
        "nan",
        "-",
    ]


def test_model_metric_series_stay_bounded_with_weighted_means_and_the_latest_value() -> None:
    """A long run's windows merge in pairs: means weigh by iterations, the last value is the
    latest window's, and a window without a finite mean (a NaN loss) does not poison the mean."""
    series = Series[MetricPoint](capacity=8)
    for n in range(100):
        mean = None if n == 7 else float(n)
        series.add(MetricPoint(10 * n, 10 * n + 9, 10, float(-n), mean, 0 if mean is None else 10))
    points = series.all()
    assert len(points) <= 8 and sum(p.windows for p in points) == 100
    assert sum(p.iterations for p in points) == 1000 and points[-1].last == -99.0
    first = points[0]  # windows 0-15 (window 7's mean missing): the mean of the other 15
    assert (first.first_iteration, first.last_iteration, first.windows) == (0, 159, 16)
    assert first.mean == pytest.approx((sum(range(16)) - 7) / 15) and first.last == -15.0


def test_compare_picks_runs_within_a_directory(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    shared = str(runs.shared)
    code, out, _ = _cli("compare", shared, shared, "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["runs"] == {"a": runs.ids["ddp"], "b": runs.ids["new"]}
    code, out, _ = _cli("compare", shared, shared, "--run-a", runs.ids["old"][:10], "--json", capsys=capsys)
    assert json.loads(out)["runs"] == {"a": runs.ids["old"], "b": runs.ids["new"]}
    code, out, _ = _cli("compare", shared, shared, shared, "--json", capsys=capsys)
    assert json.loads(out)["runs"]["all"] == [runs.ids["old"], runs.ids["ddp"], runs.ids["new"]]
    own = str(runs.own["old"])  # one run, given twice: it is both
    code, out, _ = _cli("compare", own, own, "--json", capsys=capsys)
    assert json.loads(out)["runs"] == {"a": runs.ids["old"], "b": runs.ids["old"]}
    code, out, _ = _cli("compare", str(runs.own["old"]), shared, capsys=capsys)
    assert code == 0 and f"B = {shared} (run {runs.ids['new']})" in " ".join(out.split())
    # given once: the same as twice, its two newest or the two named; never a run against itself
    code, out, _ = _cli("compare", shared, "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["runs"] == {"a": runs.ids["ddp"], "b": runs.ids["new"]}
    code, out, _ = _cli("compare", shared, "--run-a", runs.ids["old"][:10], "--json", capsys=capsys)
    assert json.loads(out)["runs"] == {"a": runs.ids["old"], "b": runs.ids["new"]}
    for alone, both in (([own], "old"), ([shared, "--run-a", runs.ids["new"]], "new")):
        code, out, err = _cli("compare", *alone, capsys=capsys)
        assert (code, out) == (2, "") and f"A and B would both be run {runs.ids[both]} of" in err


@pytest.mark.parametrize("second", [1, 0], ids=["restarted", "launched-again"])
def test_a_restarted_session_is_one_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str], second: int) -> None:  # fmt: skip
    """Two launches of session s1 (the second a restart, or the same launch started again under
    the same run id and restart count: a restart all the same), then another session s2."""
    run_job(tmp_path, monkeypatch, stepping(4), session="s1", run_id="job-a", restart=0)
    if second == 0:  # its own file, as each process of the embedded default writes
        (tmp_path / "job-a-0-0.otlp.jsonl").rename(tmp_path / "job-a-first-0.otlp.jsonl")
    run_job(tmp_path, monkeypatch, stepping(4), session="s1", run_id="job-a", restart=second)
    monkeypatch.setattr("tests.test_goodput.T0", 1_700_000_000 * 10**9 + 3600 * 10**9)
    run_job(tmp_path, monkeypatch, stepping(5), session="s2", run_id="job-b")
    code, out, _ = _cli("runs", str(tmp_path), "--json", capsys=capsys)
    assert code == 0
    listed = json.loads(out)["runs"]
    assert [(r["id"], r["run_ids"], r["restarts"], r["iterations"]) for r in listed] == [
        ("s2", ["job-b"], 0, 6), ("s1", ["job-a"], 1, 12)
    ]  # fmt: skip
    _, out, _ = _cli("summary", str(tmp_path), "--run", "s1", capsys=capsys)
    launches = sorted(tmp_path.glob("job-a-*.otlp.jsonl"))
    assert len(launches) == 2
    assert out == render(summarize(launches)) + "\n"
    assert summarize([tmp_path], run="s1").phases["model_init"].count == 2  # both launches
