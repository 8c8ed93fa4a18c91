"""The compact per-window record: what one ``training_window`` span carries, and how a reader
gets every window number back from it.

Why compact: a window's full numbers (the ~40 attributes of ``training_metrics_update`` and the
goodput record) are ~5 kB, 1.8 MB per rank per hour at 10 steps/s, and a third of them another
number gives exactly (a mean is a total over a count, a job's rate is a device's times the
world size, a deviation is a quantile over the ideal step) or are constants that belong once on
the loop (the MFU provenance, the cumulative totals). So each window leaves once, as one span
exported as soon as it closes, holding only what cannot be derived, zero counts left out, plus
the window's productive time and goodput (a trace backend cannot derive them: TraceQL metrics
cannot subtract or divide attributes). The loop segment carries the constants and totals,
overwritten at each window (they cost nothing until it ends). :func:`expand` gives a reader
the full set back, to the digit.

``TRAINTEL_WINDOW_EVENTS=on`` also puts the full ``training_metrics_update`` event on the loop
(NVIDIA one-logger's shape); the span then stays the goodput record alone.

Pure: no OpenTelemetry, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from traintel import semconv

_W: Final = semconv.WINDOW_PREFIX
AttributeMap = dict[str, float | int | str]

#: Carried by the goodput part of the record already.
_IN_GOODPUT: Final = frozenset(
    _W + name
    for name in (
        "index", "iterations", "first_iteration", "last_iteration", "iteration_time.max",
        "iteration_time.p50", "iteration_time.p90", "iteration_time.p99",
    )
)  # fmt: skip
#: Given exactly by other numbers of the record (see :func:`expand`).
_DERIVED: Final = frozenset(
    {
        _W + "iteration_time.mean",
        _W + "samples_per_second",
        _W + "tokens_per_second",
        _W + "tflops_per_device",
        _W + "data_loading_fraction",
        _W + "padding_fraction",
        _W + "time.data_loading",
        semconv.MFU_NUMERATOR,
        *(semconv.STEP_TIME_DEVIATION_PREFIX + q for q in ("p50", "p90", "p99")),
    }
)
#: The same for every window of a loop: set on the loop segment instead.
_ON_THE_LOOP: Final = frozenset(
    {
        semconv.THROUGHPUT_AGGREGATION,
        semconv.MFU_TIMING_MODE,
        semconv.MFU_FLOPS_METHOD,
        semconv.MFU_PEAK_SOURCE,
        semconv.MFU_DTYPE,
        semconv.MFU_DTYPE_REASON,
        semconv.MFU_MEASURED_PEAK,
        semconv.MFU_MEASURED_PEAK_METHOD,
    }
)
#: Left out when zero (a reader reads them as zero).
_ZERO_OMITTED: Final = frozenset(
    _W + name
    for name in (
        "nonfinite_iterations", "slow_iterations", "exported_iterations", "padding_tokens",
        "nested_badput_time", "program_startup_time",
    )
)  # fmt: skip
#: A record that carries the window's metrics (not the goodput record alone) has this key.
MARKER: Final = _W + "iteration_time.min"


def compact(
    goodput: Mapping[str, float | int | str], metrics: Mapping[str, float | int | str]
) -> AttributeMap:
    """The record: the goodput attributes and the window's metrics (``metrics``, as the
    ``training_metrics_update`` event has them), without what :func:`expand` restores."""
    out: AttributeMap = {}
    for source in (goodput, metrics):
        out.update((k, v) for k, v in source.items() if _kept(k, v, source is metrics))
    return out


def _kept(key: str, value: float | int | str, from_metrics: bool) -> bool:
    """Whether the compact record carries ``key``: not restored by :func:`expand`, not on the loop."""
    if key in _DERIVED or key in _ON_THE_LOOP or key.startswith(semconv.TOTAL_PREFIX):
        return False
    return not (from_metrics and key in _IN_GOODPUT) and not (key in _ZERO_OMITTED and not value)


def loop_attributes(metrics: Mapping[str, float | int | str]) -> AttributeMap:
    """What the loop segment carries for its windows: the throughput and MFU provenance and
    the cumulative totals, as of the latest window."""
    return {
        key: value
        for key, value in metrics.items()
        if key in _ON_THE_LOOP or key.startswith(semconv.TOTAL_PREFIX)
    }


def _number(record: Mapping[str, object], key: str) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def expand(record: Mapping[str, object], world_size: int = 1) -> dict[str, object]:
    """Every window number from a compact record: the derived ones recomputed, omitted zeros
    restored. ``world_size``: the job's, from the Resource (rates per device). A record that is
    not compact (the goodput record alone) is returned as it is."""
    out = dict(record)
    if MARKER not in record:
        return out
    for key in _ZERO_OMITTED:
        out.setdefault(key, 0)
    total = _number(record, _W + "iteration_time.total")
    loading = _number(record, _W + "data_loading_time") or 0.0
    if total is not None:
        _times(record, total, loading, out)
    _rates(record, max(1, world_size), out)
    _flops(record, out)
    _padding(record, out)
    if _W + "time.forward" in record or _W + "time.backward" in record or _W + "time.optimizer" in record:
        out[_W + "time.data_loading"] = loading
        if total:
            out[_W + "data_loading_fraction"] = loading / total
    _deviations(record, out)
    return out


def _times(record: Mapping[str, object], total: float, loading: float, out: dict[str, object]) -> None:
    """The mean iteration time and the productive time."""
    n = _number(record, _W + "iterations") or 0.0
    if n:
        out[_W + "iteration_time.mean"] = total / n
    nested = _number(record, _W + "nested_badput_time") or 0.0
    startup = _number(record, _W + "program_startup_time") or 0.0
    out[semconv.WINDOW_PRODUCTIVE_TIME] = max(0.0, total - loading - nested - startup)


def _padding(record: Mapping[str, object], out: dict[str, object]) -> None:
    tokens, padding = _number(record, _W + "tokens"), _number(record, _W + "padding_tokens")
    if padding and tokens is not None and tokens + padding > 0:
        out[_W + "padding_fraction"] = padding / (tokens + padding)


def _flops(record: Mapping[str, object], out: dict[str, object]) -> None:
    flops = _number(record, _W + "flops_per_second_per_device")
    if flops is not None:
        out[_W + "tflops_per_device"] = flops / 1e12
        if _number(record, semconv.MFU_DENOMINATOR):
            out[semconv.MFU_NUMERATOR] = flops


def _rates(record: Mapping[str, object], world: int, out: dict[str, object]) -> None:
    for rate in ("samples_per_second", "tokens_per_second"):
        per_device = _number(record, _W + rate + "_per_device")
        if per_device is not None:  # the aggregator's own product
            out[_W + rate] = per_device * world


def _deviations(record: Mapping[str, object], out: dict[str, object]) -> None:
    ideal = _number(record, semconv.STEP_TIME_IDEAL)
    if ideal:
        for q in ("p50", "p90", "p99"):
            quantile = _number(record, _W + "iteration_time." + q)
            if quantile is not None:
                out[semconv.STEP_TIME_DEVIATION_PREFIX + q] = quantile / ideal - 1
