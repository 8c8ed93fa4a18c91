"""Values training code naturally passes (tensors, numpy scalars, None, dicts) become what
OpenTelemetry accepts, with one warning per kind, and counts stay numbers that are counted."""

from __future__ import annotations

import logging

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
