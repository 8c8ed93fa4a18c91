"""A 64-rank job in the collector's file-exporter layout, analysed with exact totals, serially and
in parallel processes alike.

The files are real: 8 fake-clock training jobs (traintel's API, the embedded file exporter, one
process each) are written, then each is copied to 8 ranks (its resource's rank, instance id and
host rewritten) and the 64 ranks' lines are interleaved into 4 per-node files of 16 ranks each,
as a collector gathering all nodes would write them. Every total is known from the generation:
per rank 2,000 iterations of 0.1 s (1 ms of it data loading) with 16 samples each, 5 s of model
init, a 3 s checkpoint save every 1,000 iterations, windows of 100 iterations (10 s).
"""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from tests.subprocess_helpers import run_python
from traintel import cli
from traintel.analysis.goodput import compute_goodput, load_jobs
from traintel.analysis.report import build_report
from traintel.analysis.summary import render, summarize
from traintel.exporters import reader
from traintel.exporters.otlp_json import json_line_to_request

pytestmark = [pytest.mark.process]  # the suite's tiers: tests/tiers.py

ITERATIONS = 2000
RANKS = 64
REAL_JOBS = 8
NODES = 4
SAMPLES = 16

JOB = """
import time
S = 10**9
NOW = [1_700_000_000 * S]
time.time_ns = lambda: NOW[0]
time.monotonic_ns = time.time_ns  # traintel times with both: one simulated timeline
def tick(seconds):
    NOW[0] += round(seconds * S)
import traintel
traintel.configure(warmup_iterations=0)
with traintel.application():
    with traintel.model_init():
        tick(5)
    with traintel.training_loop(train_iterations_start=0):
        for i in range(ITERATIONS):
            with traintel.training_iteration(samples=SAMPLES):
                with traintel.data_loading():
                    tick(0.001)
                with traintel.model_forward():
                    tick(0.04)
                with traintel.model_backward():
                    tick(0.05)
                with traintel.optimizer_update():
                    tick(0.009)
                traintel.record_metrics(loss=1.0 / (i + 1))
            if (i + 1) % 1000 == 0:
                with traintel.checkpoint_save(iteration=i + 1):
                    tick(3)
traintel.shutdown()
"""


def _real_job(root: Path, rank: int) -> Path:
    work = root / f"job-{rank}"
    work.mkdir()
    result = run_python(
        f"ITERATIONS = {ITERATIONS}\nSAMPLES = {SAMPLES}\n" + JOB,
        work,
        TRAINTEL_OUTPUT_DIR=str(work / "out"),
        TRAINTEL_RUN_ID="scale-job",
        TRAINTEL_WINDOW_MIN_SECONDS="10",
        TRAINTEL_CROSS_RANK="off",
        RANK=str(rank),
        LOCAL_RANK=str(rank % 16),
        WORLD_SIZE=str(RANKS),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = (work / "out").glob("*.otlp.jsonl")  # (beside its progress mark)
    return path


def _as_rank(lines: list[bytes], rank: int) -> list[bytes]:
    """The lines of a real job, as rank ``rank`` on node ``rank // 16`` would have written them."""
    out = []
    for line in lines:
        tree = orjson.loads(line)
        for group in tree.get("resourceSpans", []) + tree.get("resourceMetrics", []):
            for kv in group["resource"]["attributes"]:
                key, value = kv["key"], kv["value"]
                if key == "ml.training.rank":
                    value["intValue"] = str(rank)
                elif key == "service.instance.id":
                    value["stringValue"] = f"instance-{rank:02d}"
                elif key == "host.name":
                    value["stringValue"] = f"node-{rank // 16}"
        out.append(orjson.dumps(tree))
    return out


def _real_of(rank: int) -> int:
    """Rank 0 is real job 0 (in a job this large only rank 0 exports the per-window events),
    the other ranks copies of real jobs 1-7."""
    return 0 if rank == 0 else 1 + (rank - 1) % (REAL_JOBS - 1)


@pytest.fixture(scope="module")
def node_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("scale")
    with ThreadPoolExecutor(2) as pool:
        real = list(pool.map(lambda rank: _real_job(root, rank), range(REAL_JOBS)))
    real_lines = [[line for line in path.read_bytes().splitlines() if line.strip()] for path in real]
    collector = root / "collector"
    collector.mkdir()
    files = []
    per_node = RANKS // NODES
    for node in range(NODES):
        ranks = [
            _as_rank(real_lines[_real_of(rank)], rank)
            for rank in range(node * per_node, (node + 1) * per_node)
        ]
        mixed = [line for group in itertools.zip_longest(*ranks) for line in group if line is not None]
        path = collector / f"node-{node}.otlp.jsonl"
        path.write_bytes(b"\n".join(mixed) + b"\n")
        files.append(path)
    return files


def test_summary_totals_are_exact_serial_and_parallel(node_files: list[Path]) -> None:
    serial = summarize(node_files)
    parallel = summarize(node_files, workers=2)
    assert serial.ranks == set(range(RANKS)) and serial.hosts == {f"node-{n}" for n in range(NODES)}
    assert serial.window_iterations == ITERATIONS  # rank 0's window events (see _real_of)
    assert serial.windows == ITERATIONS // 100
    assert serial.phases["checkpoint_save_sync"].count == RANKS * ITERATIONS // 1000
    assert serial.phases["model_init"].total_s == pytest.approx(RANKS * 5.0)
    assert serial.stats.skipped == 0 and serial.stats.files == NODES
    assert serial.window_iteration_s == pytest.approx(ITERATIONS * 0.1)
    assert serial.summary_value("samples_per_second") == pytest.approx(SAMPLES * RANKS / 0.1)
    # sampled iterations, from rank 0 alone at this size: the first 10 and every 100th
    assert serial.exported_iterations == {"first": 10, "every_n": ITERATIONS // 100 - 1}
    # the loop summary's checkpoint line is one rank's, and says which
    assert "Checkpoints of rank 0: 2 saves, 6.00 s blocking in total" in render(serial)
    assert render(parallel) == render(serial)
    serial.stats = parallel.stats = reader.ReadStats()  # equal; the rest compared field by field
    assert parallel == serial


def test_goodput_buckets_are_exact_serial_and_parallel(node_files: list[Path]) -> None:
    serial = compute_goodput(load_jobs(node_files))
    parallel = compute_goodput(load_jobs(node_files, workers=2))
    assert [r.as_dict() for r in parallel] == [r.as_dict() for r in serial]
    (session,) = serial
    (job,) = session.jobs
    assert job.ranks == list(range(RANKS)) and job.status == "completed"
    saves = ITERATIONS // 1000
    total = 5 + ITERATIONS * 0.1 + 3 * saves
    assert session.total_s == pytest.approx(total, abs=1e-9)
    assert session.productive_s == pytest.approx(ITERATIONS * 0.099, abs=1e-6)
    assert session.badput_s["data_loading"] == pytest.approx(ITERATIONS * 0.001, abs=1e-6)
    assert session.badput_s["initialization"] == pytest.approx(5, abs=1e-9)
    assert session.badput_s["checkpoint_save"] == pytest.approx(3 * saves, abs=1e-9)
    assert session.badput_s["other"] == pytest.approx(0, abs=1e-6)
    assert session.last_iteration == ITERATIONS - 1
    assert set(job.goodput_by_rank) == set(range(RANKS))
    assert all(g == pytest.approx(ITERATIONS * 0.099 / total) for g in job.goodput_by_rank.values())


def test_report_and_cli_agree_serial_and_parallel(
    node_files: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    serial = build_report(node_files)
    parallel = build_report(node_files, workers=2)
    assert json.dumps(parallel.as_dict(), default=str) == json.dumps(serial.as_dict(), default=str)
    data = serial.as_dict()
    assert data["iterations"]["count"] == ITERATIONS  # the reference rank's loop summary
    assert len(serial.processes) == RANKS
    for process in serial.processes.values():  # every rank's window records
        assert sum(p.iterations for p in process.timing()) == ITERATIONS
        assert len(process.timing()) == ITERATIONS // 100
    (rank0,) = [p for p in serial.processes.values() if p.series.all()]
    assert rank0.rank == 0 and sum(p.samples or 0 for p in rank0.series.all()) == SAMPLES * ITERATIONS
    assert data["goodput"] == [g.as_dict() for g in compute_goodput(load_jobs(node_files))]
    directory = str(node_files[0].parent)
    assert cli.main(["report", directory, "--json", "--workers", "2"]) == 0
    from_cli = json.loads(capsys.readouterr().out)
    from_cli.pop("other_runs")
    assert from_cli["goodput"] == data["goodput"] and from_cli["phases"] == json.loads(
        json.dumps(data["phases"])
    )


def test_a_collector_s_rotated_files_are_read_with_the_file_they_came_from(
    node_files: list[Path], tmp_path: Path
) -> None:
    """The collector's file exporter rotates ``node-0.otlp.jsonl`` to
    ``node-0.otlp-<time>.jsonl`` (its rotation library keeps the last extension): a directory
    holding both is read as the stream unrotated (before, the rotated part was passed over in
    silence: a long job lost its first hours)."""
    lines = node_files[0].read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    (tmp_path / "node-0.otlp-2026-11-27T08-00-00.000.jsonl").write_bytes(b"".join(lines[: half // 2]))
    (tmp_path / "node-0.otlp-2026-11-28T08-00-00.000.jsonl").write_bytes(b"".join(lines[half // 2 : half]))
    (tmp_path / "node-0.otlp.jsonl").write_bytes(b"".join(lines[half:]))
    (tmp_path / "node-0.otlp-notes.jsonl").write_text("not a rotation\n")  # passed over
    for path in node_files[1:]:
        (tmp_path / path.name).write_bytes(path.read_bytes())
    assert [p.name for p in reader.expand_paths([tmp_path])][:3] == [
        "node-0.otlp-2026-11-27T08-00-00.000.jsonl",
        "node-0.otlp-2026-11-28T08-00-00.000.jsonl",
        "node-0.otlp.jsonl",
    ]
    rotated = [g.as_dict() for g in compute_goodput(load_jobs([tmp_path]))]
    assert rotated == [g.as_dict() for g in compute_goodput(load_jobs(node_files))]
    whole = summarize([tmp_path])
    assert whole.stats.files == NODES + 2 and whole.stats.skipped == 0
    assert whole.phases == summarize(node_files).phases
    assert whole.phases["checkpoint_save_sync"].count == RANKS * ITERATIONS // 1000


def test_fast_records_equal_the_proto_path(node_files: list[Path]) -> None:
    """Every line of the real files decodes to the same records both ways."""
    lines = [line for line in node_files[0].read_bytes().splitlines() if line][:40]
    for line in lines:
        request = json_line_to_request(line.decode())
        if hasattr(request, "resource_spans"):
            expected: list[object] = list(reader.spans_in(request))  # type: ignore[arg-type]
        else:
            expected = list(reader.metrics_records(request))  # type: ignore[arg-type]
        assert reader.decode_line(line) == expected
