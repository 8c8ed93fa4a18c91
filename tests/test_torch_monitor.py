"""The torch.monitor bridge: events become span events where they were logged, Stat windows
become gauge values, and uninstalling stops both."""

from __future__ import annotations

import datetime

import torch.monitor

import traintel
from tests.conftest import Pipeline
from traintel import semconv
from traintel.integrations.torch_monitor import TorchMonitorBridge, bridge_torch_monitor


def _gauge_points(pipeline: Pipeline) -> dict[str, float]:
    data = pipeline.reader.get_metrics_data()
    assert data is not None
    return {
        str(point.attributes[semconv.TORCH_MONITOR_STAT]): point.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == semconv.METRIC_TORCH_MONITOR_STAT
        for point in metric.data.data_points
    }


def test_events_land_on_the_current_span_and_stats_on_a_gauge(pipeline: Pipeline) -> None:
    aggregations = [torch.monitor.Aggregation.MEAN, torch.monitor.Aggregation.MAX]
    stat = torch.monitor.Stat("batch_ms", aggregations, datetime.timedelta(hours=1), 2)
    logged_at = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901)
    bridge = bridge_torch_monitor()
    try:
        with traintel.training_loop():
            event = torch.monitor.Event("loader_restart", logged_at, {"worker": 3, "why": "oom"})
            torch.monitor.log_event(event)
            with traintel.training_iteration():
                stat.add(1.5)
                stat.add(4.5)  # the window is full: torch.monitor emits its aggregates
    finally:
        bridge.uninstall()
    torch.monitor.log_event(torch.monitor.Event("after", logged_at, {"x": 1}))  # not forwarded

    loop = pipeline.one("training_loop")
    (restart,) = [e for e in loop.events if e.name == "loader_restart"]
    assert dict(restart.attributes or {}) == {"worker": 3, "why": "oom"}
    assert restart.timestamp == int(logged_at.replace(microsecond=0).timestamp()) * 10**9 + 678_901_000
    iteration = pipeline.one("training_iteration")
    (window,) = [e for e in iteration.events if e.name == semconv.TORCH_MONITOR_STAT_EVENT]
    assert dict(window.attributes or {}) == {"batch_ms.mean": 3.0, "batch_ms.max": 4.5}
    assert _gauge_points(pipeline) == {"batch_ms.mean": 3.0, "batch_ms.max": 4.5}
    assert all(e.name != "after" for s in pipeline.spans() for e in s.events)


def test_the_bridge_is_a_context_manager_and_uninstall_is_idempotent(pipeline: Pipeline) -> None:
    with TorchMonitorBridge() as bridge, traintel.training_loop():
        torch.monitor.log_event(torch.monitor.Event("inside", datetime.datetime.now(), {}))
    bridge.uninstall()
    assert [e.name for e in pipeline.one("training_loop").events if e.name == "inside"] == ["inside"]
