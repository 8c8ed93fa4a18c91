"""No line of a telemetry file makes a ``traintel`` command die: every command, ``replay``
included, on files whose lines a real job wrote and hypothesis then damaged where it hurts
(``Infinity`` or a 5,000-digit integer in an integer field, a lone-surrogate escape, a value of
the wrong type or kind, an id of the wrong size, nesting), exits with its status and no
traceback. The reader reads or counts every line; ``replay`` sends or sets aside every span.
A record an analysis command cannot use ends it with one line naming the file and line (status
3), never a traceback.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.otlp_receiver import HttpReceiver
from tests.subprocess_helpers import run_python
from traintel.cli import main
from traintel.exporters.reader import ReadStats, iter_records, read_requests

pytestmark = [pytest.mark.process, pytest.mark.server]

JOB = """
import traintel
with traintel.application():
    traintel.record_metrics(never=1.0)
    with traintel.training_loop():
        for i in range(12):
            with traintel.training_iteration(samples=8, tokens=64):
                with traintel.data_loading():
                    pass
                with traintel.model_forward():
                    pass
                traintel.record_metrics(loss=1.0 / (i + 1), lr=0.1)
            if i == 5:
                with traintel.checkpoint_save():
                    pass
        with traintel.validation_loop():
            with traintel.validation_iteration():
                pass
"""

#: Raw JSON put in place of one node of a line: what a damaged or hand-made file holds.
HOSTILE = [
    "Infinity", "-Infinity", "NaN", "9" * 5000, '"' + "9" * 5000 + '"', "-" + "9" * 400, "1e400",
    '"Infinity"', '"NaN"', '"\\ud800"', '"x\\udfffy"', '"\\u001b]52;c;ZXZpbA==\\u0007"', "null",
    "true", "[]", "{}", "[[[[[]]]]]", '{"a":{"b":{}}}', '""', '"zz"', '"' + "0" * 34 + '"', "-1", "0.5",
    "18446744073709551616", '"18446744073709551616"', '{"stringValue":5}', '{"intValue":"Infinity"}',
    '{"doubleValue":"x"}', '{"intValue":"' + "9" * 5000 + '"}',
    '{"arrayValue":{"values":[{"intValue":"1e3"}]}}',
    '{"kvlistValue":5}', '{"stringValue":"abc"}', '{"doubleValue":"NaN"}', '{"boolValue":true}',
    '{"arrayValue":{}}', '{"kvlistValue":{"values":[{"key":"k","value":{}}]}}', '{"bytesValue":"!!"}',
    "[" * 200 + "]" * 200,
]  # fmt: skip
COMMANDS = [
    ["summary"], ["summary", "--all"], ["runs"], ["runs", "--json"], ["goodput"], ["goodput", "--json"],
    ["report"], ["report", "--json"], ["report", "--all"], ["export-trace", "-o", "{out}/trace.json"],
    ["report", "--html", "{out}/report.html"],
]  # fmt: skip


@pytest.fixture(scope="module")
def good_lines(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """The lines of a real run: spans in several batches, metric lines."""
    directory = tmp_path_factory.mktemp("good")
    result = run_python(
        JOB,
        directory,
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_LOG_EVERY_N_ITERATIONS="5",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="8",
        OTEL_METRIC_EXPORT_INTERVAL="100",
        TRAINTEL_OUTPUT_DIR=str(directory / "runs"),
    )
    assert result.returncode == 0, result.stderr
    [path] = (directory / "runs").glob("*.otlp.jsonl")
    lines = path.read_bytes().splitlines()
    assert len(lines) >= 6
    return lines


def _nodes(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _nodes(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _nodes(value, (*path, index))
    return found


def _damage(good: list[bytes], line: int, node: int, hostile: int) -> bytes:
    """Line ``line`` of ``good`` with its ``node``-th node (a field, an attribute's value, a
    whole span...) replaced by ``HOSTILE[hostile]``."""
    tree = json.loads(good[line % len(good)])
    paths = [path for path in _nodes(tree) if path]
    path = paths[node % len(paths)]
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = "@@HOSTILE@@"
    return json.dumps(tree).replace('"@@HOSTILE@@"', HOSTILE[hostile % len(HOSTILE)]).encode()


@pytest.fixture(scope="module")
def receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as running:
        yield running


_DAMAGE = st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=3
)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(damage=_DAMAGE)
def test_no_line_makes_any_command_die(
    good_lines: list[bytes],
    receiver: HttpReceiver,
    damage: list[tuple[int, int, int]],
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = list(good_lines)
    for line, node, hostile in damage:
        lines[line % len(lines)] = _damage(good_lines, line, node, hostile)
    directory = tmp_path_factory.mktemp("hostile")
    path = directory / "run.otlp.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    stats = ReadStats()
    read = sum(1 for _ in read_requests([path], stats))
    assert read + stats.skipped == len(lines)  # each line read or counted, never raised
    list(iter_records([path], ReadStats(), windows_expanded=True))
    capsys.readouterr()
    for command in COMMANDS:
        argv = [command[0], str(path), *(arg.format(out=directory) for arg in command[1:])]
        code = main(argv)
        err = capsys.readouterr().err
        assert code in (0, 1, 2, 3) and "Traceback" not in err, (argv, code, err)
        assert code != 3 or f"stopped at {path}:" in err, err
    replay = ["replay", str(directory), "--endpoint", receiver.endpoint, "--protocol", "http/protobuf"]
    assert main(replay) in (0, 1), capsys.readouterr()  # the reader and the sender never stop it


def test_the_three_lines_that_stopped_the_reader(good_lines: list[bytes], tmp_path: Path) -> None:
    """``Infinity`` in an integer field, a 5,000-digit integer, a lone-surrogate escape: each
    line counted as skipped, with a reason, and the rest read (replay's reader included)."""
    span_line = next(line for line in good_lines if line.startswith(b'{"resourceSpans"'))
    bad = [
        span_line.replace(b'"startTimeUnixNano":"', b'"startTimeUnixNano":Infinity,"x":"', 1),
        span_line.replace(b'"startTimeUnixNano":"', b'"startTimeUnixNano":' + b"9" * 5000 + b',"x":"', 1),
        span_line.replace(b'"name":"', b'"name":"\\ud800', 1),
    ]
    path = tmp_path / "run.otlp.jsonl"
    path.write_bytes(b"\n".join([*good_lines, *bad]) + b"\n")
    for read in (read_requests, iter_records):
        stats = ReadStats()
        list(read([path], stats))
        assert stats.skipped == 3 and stats.lines == len(good_lines), stats.reasons
        assert all(reason for reason in stats.reasons)


def test_a_reason_quoting_a_lone_surrogate_is_printed(
    good_lines: list[bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parser's message for ``{"resourceSpans": "\\ud800"}`` quotes the lone surrogate; said
    by ``replay`` (and every command), it is printed as U+FFFD instead of stopping the print."""
    path = tmp_path / "run.otlp.jsonl"
    path.write_bytes(b"\n".join([*good_lines, b'{"resourceSpans": "\\ud800"}']) + b"\n")
    with HttpReceiver() as receiver:
        code = main(["replay", str(path), "--endpoint", receiver.endpoint, "--protocol", "http/protobuf"])
    out = capsys.readouterr().out
    assert code == 1 and "not sent: 1 unreadable line(s)" in out, out
    assert "\ufffd" in out


def test_a_run_archived_with_gzip_reads_as_its_file(
    good_lines: list[bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gzip`` on a run's file (archived runs): the commands read ``.otlp.jsonl.gz`` as the
    file it holds (before: "no telemetry files found" for its directory, and every line "not
    UTF-8" named alone); a compressed file beside its own original (``gzip -k``) is read once,
    and one cut short or not gzip at all is counted and named, the rest read."""
    data = b"\n".join(good_lines) + b"\n"
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    (plain / "job.otlp.jsonl").write_bytes(data)
    (packed / "job.otlp.jsonl.gz").write_bytes(gzip.compress(data))

    def report(path: Path) -> dict[str, Any]:
        assert main(["report", "--json", str(path)]) == 0
        found: dict[str, Any] = json.loads(capsys.readouterr().out)
        del found["files"]
        return found

    expected = report(plain)
    assert report(packed) == expected
    shutil.copy(plain / "job.otlp.jsonl", packed)  # gzip -k: both there, the run read once
    assert report(packed) == expected
    (packed / "job.otlp.jsonl").unlink()
    (packed / "cut.otlp.jsonl.gz").write_bytes(gzip.compress(data)[: len(data) // 20])
    (packed / "not.otlp.jsonl.gz").write_bytes(data)
    stats = ReadStats()
    records = list(iter_records([packed], stats))
    assert len(records) > 0 and stats.files == 3
    reasons = "\n".join(stats.reasons)
    assert "cut.otlp.jsonl.gz: unreadable from here on (Compressed file ended" in reasons, reasons
    assert "not.otlp.jsonl.gz: unreadable from here on (Not a gzipped file" in reasons, reasons
