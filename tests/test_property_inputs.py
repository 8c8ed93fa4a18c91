"""Bad input, generated: the configuration parser and the OTLP/JSON-lines reader either accept a
value, or refuse it with an error naming it, or skip and count it — never another exception,
never a hang. Example counts are bounded so the suite stays fast."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from traintel import environment_variables as ev  # noqa: E402
from traintel.analysis.report import build_report  # noqa: E402
from traintel.config import FIELD_NAMES, ConfigurationError, TrainingConfig  # noqa: E402
from traintel.exporters import reader  # noqa: E402

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

numberish = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e309", "-0", " 5 ", "5.0", "0x10", "1_000", "", "   ", "true"]),
)
env_values = st.one_of(numberish, st.text(max_size=40))


@FAST
@given(st.dictionaries(st.sampled_from(ev.ALL), env_values, max_size=6))
def test_config_from_env_accepts_or_names_the_variable(environ: dict[str, str]) -> None:
    try:
        config = TrainingConfig.from_env(environ, strict=True)
    except ConfigurationError as exc:
        message = str(exc)
        assert any(f"{name}={environ[name]!r}" in message for name in environ), message
    else:
        config.resolve()  # never raises
    lenient = TrainingConfig.from_env(environ, strict=False)  # never raises: bad settings ignored
    lenient.resolve()


python_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=10),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers()),
)


@FAST
@given(st.sampled_from(FIELD_NAMES), python_values)
def test_config_overrides_accept_or_name_the_argument(name: str, value: object) -> None:
    try:
        config = TrainingConfig({name: value})
    except ConfigurationError as exc:
        assert str(exc).startswith(f"{name}="), str(exc)
        return
    got = getattr(config.resolve(), name)
    if isinstance(got, float):
        assert math.isfinite(got)


@pytest.fixture(scope="module")
def good_lines(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """Real lines of a real run (spans and metrics), to mix with damage."""
    from tests.test_goodput import clean_job, run_job

    directory = tmp_path_factory.mktemp("good")
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_job(directory, monkeypatch, clean_job)
    finally:
        monkeypatch.undo()
    (path,) = directory.iterdir()
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    assert lines
    return lines


def _damage(good: list[bytes]) -> st.SearchStrategy[bytes]:
    valid = st.sampled_from(good)
    wrong_types = st.sampled_from(
        [
            b'{"resourceSpans": 5}',
            b'{"resourceSpans": [{"scopeSpans": "x"}]}',
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": 7, "traceId": "zz"}]}]}]}',
            b'{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "m", "gauge": 1}]}]}]}',
            b"[1, 2, 3]",
            b"null",
            b'"text"',
            b'{"neither": true}',
        ]
    )
    truncated = valid.flatmap(lambda line: st.integers(1, max(1, len(line) - 1)).map(lambda n: line[:n]))
    garbage = st.binary(max_size=200).filter(lambda b: b"\n" not in b and b"\r" not in b)
    huge = st.integers(2_000, 5_000).map(lambda n: b'{"resourceSpans": [' + b" " * n + b"]}")
    return st.one_of(valid, valid, wrong_types, truncated, garbage, huge)


def _write(path: Path, lines: list[bytes], cut_last: bool) -> None:
    data = b"\n".join(lines) + (b"" if cut_last else b"\n")
    path.write_bytes(data)


@FAST
@given(data=st.data())
def test_reader_decodes_or_counts_every_line(
    tmp_path_factory: pytest.TempPathFactory,
    good_lines: list[bytes],
    data: st.DataObject,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 1_000)  # the over-long path, without 64 MB lines
    lines = data.draw(st.lists(_damage(good_lines), min_size=1, max_size=12))
    cut_last = data.draw(st.booleans())
    path = tmp_path_factory.mktemp("damaged") / "run.otlp.jsonl"
    _write(path, lines, cut_last)
    stats = reader.ReadStats()
    requests = list(reader.read_requests([path], stats))
    non_empty = sum(1 for line in path.read_bytes().split(b"\n") if line.strip())
    assert stats.lines == len(requests)
    assert stats.lines + stats.skipped == non_empty
    assert all(reason for reason in stats.reasons)
    list(reader.iter_spans([path]))  # flattening what was decoded never raises
    report = build_report([path])  # nor does the whole report, goodput included
    json.dumps(report.as_dict(), default=str)
