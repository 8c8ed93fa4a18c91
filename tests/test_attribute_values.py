"""Values training code naturally passes (tensors, numpy scalars, None, dicts) become what
OpenTelemetry accepts, with one warning per kind, and counts stay numbers that are counted."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from opentelemetry.sdk.metrics.export import MetricsData

import traintel
from tests.conftest import Pipeline
from traintel import semconv

np = pytest.importorskip("numpy")


def test_values_are_converted_or_dropped_once(pipeline: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    odd = {
        "tensor": torch.tensor(1.5), "np_float": np.float32(2.5), "np_int": np.int64(3), "none": None,
        "nested": {"b": 2, "a": 1}, "big": torch.ones(3), "mixed": [1, "x"], "text": "kept",
    }  # fmt: skip
    with traintel.application(attributes=odd):
        with traintel.training_loop():
            for n in range(3):
                with traintel.training_iteration(n, samples=np.int64(8), tokens=torch.tensor(16)) as it:
                    it.set_attribute("loss_tensor", torch.tensor(0.25))
                    it.set_attribute("dropped", torch.ones(2))
                    traintel.record_batch(samples=np.int64(0))
    app = pipeline.one("application").attributes or {}
    assert (app["tensor"], app["np_float"], app["np_int"], app["text"]) == (1.5, 2.5, 3, "kept")
    assert type(app["np_int"]) is int and app["nested"] == '{"a": 1, "b": 2}'
    assert "none" not in app and "big" not in app and "mixed" not in app
    first = pipeline.by_name("training_iteration")[0].attributes or {}
    assert first[semconv.SAMPLES] == 8 and first[semconv.TOKENS] == 16
    assert first["loss_tensor"] == 0.25 and "dropped" not in first
    counted = {
        m.name: sum(p.value for p in m.data.data_points)  # type: ignore[union-attr]
        for rm in (pipeline.reader.get_metrics_data() or MetricsData([])).resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name in (semconv.METRIC_SAMPLES, semconv.METRIC_TOKENS)
    }
    assert counted == {semconv.METRIC_SAMPLES: 24, semconv.METRIC_TOKENS: 48}
    warnings = [r.getMessage() for r in caplog.records]
    assert not [w for w in warnings if "Invalid type" in w]  # the SDK never saw them
    # None means "not given": dropped without a word, as everywhere in the API
    for text in ("type Tensor dropped", "type int64 converted", "type dict converted", "type list dropped"):
        assert sum(text in w for w in warnings) == 1, (text, warnings)


def test_record_batch_counts_tensors_and_numpy_scalars(owned: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The counts a loop has at hand (``mask.sum()``, a numpy length) are counted through
    ``.item()``; a count that is no number leaves out that count alone, said once."""
    caplog.set_level(logging.WARNING)
    job = owned(warmup_iterations=0, log_every_n_iterations=3, export_iterations="none")
    with traintel.training_loop(train_iterations_start=0):
        for _ in range(3):
            with traintel.training_iteration():
                traintel.record_batch(samples=4, tokens=torch.ones(4, 8).sum(), padding_tokens=np.int64(2))
                traintel.record_batch(samples=np.int64(4), tokens=32)
                traintel.record_batch(samples=1, tokens=torch.ones(2))  # tokens dropped, samples kept
    (window,) = job.events("training_metrics_update")
    W = semconv.WINDOW_PREFIX
    assert (window[W + "samples"], window[W + "tokens"], window[W + "padding_tokens"]) == (27, 192, 6)
    assert sum("record_batch(tokens=tensor([1., 1.]))" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("via", ["training_iteration", "record_batch"])
def test_a_nan_or_negative_count_is_left_out_not_poisoning_the_run(
    owned: Any, caplog: pytest.LogCaptureFixture, via: str
) -> None:
    """One step's NaN or negative count (a bad ``mask.sum()``) is left out, said once naming the
    call, argument and value: counted, it made that window's and the whole run's totals and
    rates NaN (or negative) for good."""
    caplog.set_level(logging.WARNING)
    job = owned(warmup_iterations=0, log_every_n_iterations=3, export_iterations="none")
    with traintel.training_loop(train_iterations_start=0):
        for step in range(6):
            counts: dict[str, float] = (
                {"samples": math.nan, "tokens": -100} if step == 1 else {"samples": 8, "tokens": 64}
            )
            if via == "training_iteration":
                with traintel.training_iteration(**counts):
                    pass
            else:
                with traintel.training_iteration():
                    traintel.record_batch(**counts)
    W = semconv.WINDOW_PREFIX
    windows = job.events("training_metrics_update")
    assert [(w[W + "samples"], w[W + "tokens"]) for w in windows] == [(16, 128), (24, 192)]
    rates = [w[f"{W}{n}_per_second_per_device"] for w in windows for n in ("samples", "tokens")]
    assert all(math.isfinite(rate) and rate > 0 for rate in rates)
    said = [r.getMessage() for r in caplog.records]
    for bad in ("samples=nan", "tokens=-100"):
        assert sum(f"{via}({bad}): expected a finite non-negative number" in m for m in said) == 1


# --- the conversion is total: any value, a valid attribute or dropped, never an exception -------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from opentelemetry.attributes import BoundedAttributes  # noqa: E402
from opentelemetry.exporter.otlp.proto.common._internal import _encode_attributes  # noqa: E402

from tests.subprocess_helpers import run_python  # noqa: E402
from traintel._sdk import attributes as attributes_module  # noqa: E402
from traintel._sdk.attributes import clean_attributes, clean_value  # noqa: E402


class _Broken:
    """An object whose every method a conversion might call raises."""

    def __len__(self) -> int:
        raise RuntimeError("len")

    def __iter__(self) -> Any:
        raise RuntimeError("iter")

    def __str__(self) -> str:
        raise RuntimeError("str")

    __repr__ = __str__

    def item(self) -> float:
        raise RuntimeError("item")


class _BrokenList(list[int]):
    """A sequence whose iteration raises."""

    def __iter__(self) -> Any:
        raise RuntimeError("iter")


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),  # lone surrogates included
    st.binary(max_size=8),
    st.builds(_Broken),
    st.builds(_BrokenList),
    st.builds(object),
    st.just(np.float32(1.5)),
    st.just(torch.ones(3)),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), inner, max_size=5),
        st.frozensets(st.integers(), max_size=3),
    ),
    max_leaves=30,
)


def _is_valid_attribute(value: object) -> bool:
    """What the SDK keeps without changing and the OTLP encoder takes."""
    kept = BoundedAttributes(attributes={"k": value})  # type: ignore[dict-item]
    return "k" in kept and len(_encode_attributes(dict(kept))) == 1


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_any_value_becomes_a_valid_attribute_or_is_dropped(value: object) -> None:
    cleaned = clean_value("k", value)
    if cleaned is not None:
        assert _is_valid_attribute(cleaned), cleaned
        longest = getattr(attributes_module, "MAX_JSON_CHARS", 65_536)
        assert not isinstance(cleaned, str) or isinstance(value, str) or len(cleaned) <= longest
    assert set(clean_attributes({"k": value, 7: value, "": value})) <= {"k"}  # type: ignore[dict-item]


def _self_containing() -> tuple[dict[str, Any], list[Any]]:
    ring: dict[str, Any] = {"a": 1}
    ring["self"] = ring
    loop: list[Any] = [1, 2]
    loop.append(loop)
    return ring, loop


def test_deep_self_containing_huge_and_broken_values_are_dropped_with_one_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attributes_module, "_warned", set())  # what earlier tests said is said again here
    caplog.set_level(logging.WARNING)
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(1000):
        node["x"] = {}
        node = node["x"]
    ring, loop = _self_containing()
    wide = {str(i): i for i in range(20_000)}
    for value in (deep, ring, loop, wide, list(range(20_000)), _Broken(), _BrokenList([1])):
        assert clean_value("k", value) is None
    assert clean_value("k", 2**70) == str(2**70) and clean_value("k", [1, 2.5]) == [1.0, 2.5]
    assert clean_value("k", {"a": {"b": [1, {"c": None}]}}) == '{"a": {"b": [1, {"c": null}]}}'
    messages = [r.getMessage() for r in caplog.records]
    reasons = (
        "nested deeper than 16",
        "contains itself",
        "more than 10,000",
        "raised RuntimeError",
        "no attribute",
    )
    for reason in reasons:
        assert sum(reason in m for m in messages) >= 1, (reason, messages)


_HOSTILE_JOB = """
import traintel
deep = node = {}
for _ in range(1000):
    node["x"] = {}
    node = node["x"]
ring = {"a": 1}
ring["self"] = ring
loop = [1]
loop.append(loop)
hostile = {"deep": deep, "ring": ring, "loop": loop, "huge": 2**70, "ok": "kept"}
with traintel.application(attributes=hostile):
    with traintel.training_loop(attributes=hostile):
        for n in range(6):
            with traintel.training_iteration(attributes=hostile) as it:
                it.set_attribute("ring", ring)
                it.set_attribute("deep", deep)
                with traintel.model_forward() as forward:
                    forward.set_attribute("loop", loop)
print("trained", flush=True)
"""


@pytest.mark.process
def test_a_job_passing_hostile_values_trains_to_the_end_and_exports_everything(tmp_path: Path) -> None:
    """A real job: a dict nested 1,000 deep, a dict and a list that contain themselves and an
    int beyond int64 on every phase; before, a phase raised RecursionError/ValueError into it."""
    from traintel.exporters.reader import iter_spans

    result = run_python(
        _HOSTILE_JOB,
        tmp_path,
        TRAINTEL_EXPORT_ITERATIONS="all",
        TRAINTEL_OUTPUT_DIR=str(tmp_path / "runs"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    spans = list(iter_spans(sorted((tmp_path / "runs").glob("*.otlp.jsonl"))))
    names = [s.name for s in spans]
    assert names.count("training_iteration") == 6 and names.count("model_forward") == 6
    app = next(s for s in spans if s.name == "application")
    assert app.attributes["ok"] == "kept" and app.attributes["huge"] == str(2**70)
    assert not {"deep", "ring", "loop"} & set(app.attributes)
    for reason in ("nested deeper than 16", "contains itself"):
        assert result.stderr.count(reason) >= 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
