"""Training facts and traintel's own knobs: parsing, validation and lazy values.

Why lazy values: a job often learns its batch size only after the data loader exists and its
world size only after ``dist_init``. Any field may therefore be a zero-argument callable that
is resolved when the value is needed (and validated then), and ``set_training_config`` may
supply values after telemetry started.

Why two error modes: an explicit ``configure()`` should fail fast with one error that names
the variable or argument and the bad value, before anything is half-built; implicit
auto-configuration must never stop a training job, so it logs that same message and ignores
only the bad setting.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from traintel import environment_variables as ev

_logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Compute dtypes the peak-FLOPs table knows.
DTYPES: Final = ("fp32", "tf32", "bf16", "fp16", "fp8")


class ConfigurationError(ValueError):
    """A configuration value is invalid; the message names the setting and the bad value."""


def _positive_int(raw: object) -> int:
    if isinstance(raw, bool):
        raise ValueError("expected a positive integer")
    if isinstance(raw, str):
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("expected a positive integer") from None
    elif isinstance(raw, int):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    else:
        raise ValueError("expected a positive integer")
    if value <= 0:
        raise ValueError("expected a positive integer")
    return value


def _non_negative_int(raw: object) -> int:
    if isinstance(raw, str) and raw.strip() == "0":
        return 0
    if raw == 0 and not isinstance(raw, bool):
        return 0
    try:
        return _positive_int(raw)
    except ValueError:
        raise ValueError("expected a non-negative integer") from None


def _choice(*allowed: str) -> Callable[[object], str]:
    def parse(raw: object) -> str:
        value = raw.strip().lower() if isinstance(raw, str) else raw
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return str(value)

    return parse


def _factor(raw: object) -> float:
    value = _number(raw, allow_zero=False)
    if value <= 1:
        raise ValueError("expected a number greater than 1")
    return value


def _number(raw: object, *, allow_zero: bool) -> float:
    expected = "a non-negative number" if allow_zero else "a positive number"
    if isinstance(raw, bool):
        raise ValueError(f"expected {expected}")
    if isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(f"expected {expected}") from None
    elif isinstance(raw, int | float):
        value = float(raw)
    else:
        raise ValueError(f"expected {expected}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"expected {expected}")
    return value


def _positive_number(raw: object) -> float:
    return _number(raw, allow_zero=False)


def _non_negative_number(raw: object) -> float:
    return _number(raw, allow_zero=True)


#: The longest wait a setting in seconds may ask for: a day. Far above any sane exit or exchange
#: bound, and far below what clocks and thread waits overflow at (~9.2e9 s).
MAX_WAIT_SECONDS: Final = 86_400.0


def _wait_bound(*, allow_zero: bool) -> Callable[[object], float]:
    def parse(raw: object) -> float:
        value = _number(raw, allow_zero=allow_zero)
        if value > MAX_WAIT_SECONDS:
            low = "0" if allow_zero else "above 0"
            raise ValueError(f"expected seconds from {low} to {MAX_WAIT_SECONDS:,.0f}")
        return value

    return parse


_exit_seconds = _wait_bound(allow_zero=True)
_exchange_seconds = _wait_bound(allow_zero=False)


def _non_empty_str(raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("expected a non-empty string")
    return raw.strip()


@dataclass(frozen=True)
class _Field(Generic[T]):
    name: str
    env: str
    parse: Callable[[object], T]
    default: T | None
    doc: str


_FIELDS: Final[tuple[_Field[Any], ...]] = (
    _Field("session_tag", ev.TRAINTEL_SESSION_TAG, _non_empty_str, None, "jobs of one logical task"),
    _Field("perf_tag", ev.TRAINTEL_PERF_TAG, _non_empty_str, None, "jobs expected to perform alike"),
    _Field("run_id", ev.TRAINTEL_RUN_ID, _non_empty_str, None, "id shared by all ranks of a job"),
    _Field("global_batch_size", ev.TRAINTEL_GLOBAL_BATCH_SIZE, _positive_int, None, "samples per step"),
    _Field("seq_len", ev.TRAINTEL_SEQ_LEN, _positive_int, None, "tokens per sample"),
    _Field("flops_per_sample", ev.TRAINTEL_FLOPS_PER_SAMPLE, _positive_number, None, "model FLOPs/sample"),
    _Field("flops_per_token", ev.TRAINTEL_FLOPS_PER_TOKEN, _positive_number, None, "model FLOPs/token"),
    _Field(
        "executed_flops_per_sample",
        ev.TRAINTEL_EXECUTED_FLOPS_PER_SAMPLE,
        _positive_number,
        None,
        "executed FLOPs/sample (recompute included), for HFU",
    ),
    _Field("peak_flops", ev.TRAINTEL_PEAK_FLOPS, _positive_number, None, "dense peak FLOP/s per device"),
    _Field("log_every_n_iterations", ev.TRAINTEL_LOG_EVERY_N_ITERATIONS, _positive_int, 50, "window size"),
    _Field("window_min_seconds", ev.TRAINTEL_WINDOW_MIN_SECONDS, _non_negative_number, 30.0, "min window s"),
    _Field("log_every_n_seconds", ev.TRAINTEL_LOG_EVERY_N_SECONDS, _positive_number, 60.0, "max window s"),
    _Field("output_dir", ev.TRAINTEL_OUTPUT_DIR, _non_empty_str, "traintel-runs", "embedded file dir"),
    _Field(
        "shutdown_timeout", ev.TRAINTEL_SHUTDOWN_TIMEOUT, _wait_bound(allow_zero=True), 5.0, "exit bound, s"
    ),
    _Field(
        "stall_seconds", ev.TRAINTEL_STALL_SECONDS, _wait_bound(allow_zero=True), 30.0, "hang suspect after s"
    ),
    _Field("warmup_iterations", ev.TRAINTEL_WARMUP_ITERATIONS, _non_negative_int, 1, "left out of totals"),
    _Field("dtype", ev.TRAINTEL_DTYPE, _choice(*DTYPES), None, "training compute dtype, for peak FLOPs"),
    _Field(
        "flops_method",
        ev.TRAINTEL_FLOPS_METHOD,
        _choice("config", "formula", "counter", "counter+attention", "callable"),
        None,
        "how flops_per_* was obtained",
    ),
    _Field(
        "export_iterations",
        ev.TRAINTEL_EXPORT_ITERATIONS,
        _choice("sampled", "all", "none"),
        "sampled",
        "policy",
    ),
    _Field("export_first_iterations", ev.TRAINTEL_EXPORT_FIRST_ITERATIONS, _non_negative_int, 10, "first K"),
    _Field(
        "export_every_n_iterations", ev.TRAINTEL_EXPORT_EVERY_N_ITERATIONS, _non_negative_int, 100, "every M"
    ),
    _Field(
        "export_every_n_seconds",
        ev.TRAINTEL_EXPORT_EVERY_N_SECONDS,
        _non_negative_number,
        60.0,
        "every M-th at least this many s apart",
    ),
    _Field(
        "export_tail_per_minute",
        ev.TRAINTEL_EXPORT_TAIL_PER_MINUTE,
        _non_negative_number,
        1.0,
        "slow / non-finite exports per minute",
    ),
    _Field(
        "window_events",
        ev.TRAINTEL_WINDOW_EVENTS,
        _choice("off", "on"),
        "off",
        "full training_metrics_update event per window",
    ),
    _Field("slow_iteration_factor", ev.TRAINTEL_SLOW_ITERATION_FACTOR, _factor, 3.0, "k x rolling median"),
    _Field(
        "segment_iterations", ev.TRAINTEL_SEGMENT_ITERATIONS, _positive_int, 1_000_000, "iterations per trace"
    ),
    _Field("segment_seconds", ev.TRAINTEL_SEGMENT_SECONDS, _positive_number, 600.0, "seconds per trace"),
    _Field("max_spans_per_trace", ev.TRAINTEL_MAX_SPANS_PER_TRACE, _positive_int, 2000, "span budget"),
    _Field("max_bytes_per_trace", ev.TRAINTEL_MAX_BYTES_PER_TRACE, _positive_int, 4_000_000, "byte budget"),
    _Field("cross_rank", ev.TRAINTEL_CROSS_RANK, _choice("auto", "off"), "auto", "cross-rank statistics"),
    _Field(
        "cross_rank_timeout",
        ev.TRAINTEL_CROSS_RANK_TIMEOUT,
        _wait_bound(allow_zero=False),
        30.0,
        "exchange bound, s",
    ),
    _Field(
        "cross_rank_scale_world_size",
        ev.TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE,
        _positive_int,
        64,
        "world size from which ranks other than 0 export only their anomalies",
    ),
    _Field("cross_rank_top_k", ev.TRAINTEL_CROSS_RANK_TOP_K, _positive_int, 3, "slowest ranks named"),
    _Field("straggler_factor", ev.TRAINTEL_STRAGGLER_FACTOR, _factor, 1.25, "k x other ranks' median"),
    _Field("cuda_event_timing", ev.TRAINTEL_CUDA_EVENT_TIMING, _choice("off", "on"), "off", "GPU step times"),
    _Field("nvtx", ev.TRAINTEL_NVTX, _choice("off", "on"), "off", "NVTX range per phase span"),
    _Field("measure_peak", ev.TRAINTEL_MEASURE_PEAK, _choice("off", "on"), "off", "matmul peak at start"),
    _Field("energy_price_per_kwh", ev.TRAINTEL_ENERGY_PRICE_PER_KWH, _positive_number, None, "energy cost"),
    _Field("spool_dir", ev.TRAINTEL_SPOOL_DIR, _non_empty_str, None, "export spool dir"),
    _Field("spool_max_bytes", ev.TRAINTEL_SPOOL_MAX_BYTES, _non_negative_int, 268_435_456, "spool bound"),
    _Field("spool_retry_interval", ev.TRAINTEL_SPOOL_RETRY_INTERVAL, _positive_number, 5.0, "resend every s"),
)
_BY_NAME: Final = {f.name: f for f in _FIELDS}
#: Names accepted by ``configure()`` / ``set_training_config()`` as training facts.
FIELD_NAMES: Final = tuple(_BY_NAME)
#: Each ``TRAINTEL_*`` variable's default, where it has one: what the documentation shows.
DEFAULTS: Final = {f.env: f.default for f in _FIELDS if f.default is not None}
#: Fields that must be concrete when telemetry starts (they shape files and exit), not lazy.
_EAGER: Final = frozenset(
    {
        "output_dir", "shutdown_timeout", "run_id", "session_tag", "export_iterations",
        "export_first_iterations", "export_every_n_iterations", "export_every_n_seconds",
        "export_tail_per_minute", "slow_iteration_factor", "window_events",
        "segment_iterations", "segment_seconds", "max_spans_per_trace", "max_bytes_per_trace",
        "spool_dir", "spool_max_bytes", "spool_retry_interval",
        "log_every_n_iterations", "window_min_seconds", "log_every_n_seconds", "warmup_iterations",
        "cuda_event_timing", "nvtx", "stall_seconds",
    }
)  # fmt: skip


def _check(field: _Field[Any], value: object, source: str) -> object:
    """Validate ``value`` for ``field``; callables pass (they are checked when resolved)."""
    if callable(value):
        if field.name in _EAGER:
            raise ConfigurationError(f"{source}: {field.name} cannot be a callable, it is needed at start")
        return value
    try:
        return field.parse(value)
    except ValueError as exc:
        raise ConfigurationError(f"{source}={value!r}: {exc}") from None


def window_seconds(config: TrainingConfig) -> tuple[float, float]:
    """A window's floor and ceiling in seconds; the floor is at most the ceiling (it wins)."""
    ceiling = float(config.get("log_every_n_seconds"))
    return min(float(config.get("window_min_seconds")), ceiling), ceiling


class TrainingConfig:
    """An immutable set of training facts; each value is concrete, lazy (callable) or unset.

    Build one with :meth:`from_env`, derive updated copies with :meth:`updated`, and read
    values with :meth:`get`, which resolves callables and never raises.
    """

    __slots__ = ("_lock", "_values", "_warned")

    def __init__(self, values: Mapping[str, object] | None = None) -> None:
        self._values: dict[str, object] = {}
        for name, value in (values or {}).items():
            field = _BY_NAME.get(name)
            if field is None:
                raise ConfigurationError(f"{name}: unknown training config setting (known: {FIELD_NAMES})")
            if value is not None:
                self._values[name] = _check(field, value, name)
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        overrides: Mapping[str, object] | None = None,
        *,
        strict: bool,
    ) -> TrainingConfig:
        """Read ``TRAINTEL_*`` variables, then apply explicit ``overrides`` on top.

        With ``strict`` the first bad value raises :class:`ConfigurationError` (naming the
        variable or argument); without it the error is logged and that one setting ignored.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for field in _FIELDS:
            raw = environ.get(field.env)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[field.name] = _check(field, raw, field.env)
            except ConfigurationError as exc:
                if strict:
                    raise
                _logger.error("traintel: ignoring bad setting: %s", exc)
        for name, value in (overrides or {}).items():
            spec = _BY_NAME.get(name)
            if spec is None:
                error = ConfigurationError(f"{name}: unknown training config setting (known: {FIELD_NAMES})")
                if strict:
                    raise error
                _logger.error("traintel: ignoring bad setting: %s", error)
                continue
            if value is None:
                continue
            try:
                values[name] = _check(spec, value, name)
            except ConfigurationError as exc:
                if strict:
                    raise
                _logger.error("traintel: ignoring bad setting: %s", exc)
        return cls(values)

    def updated(self, **changes: object) -> TrainingConfig:
        """A copy with ``changes`` applied; raises :class:`ConfigurationError` on a bad value.

        Validation happens before anything is copied, so a bad call changes nothing.
        """
        for name, value in changes.items():
            field = _BY_NAME.get(name)
            if field is None:
                raise ConfigurationError(f"{name}: unknown training config setting (known: {FIELD_NAMES})")
            if value is not None:
                _check(field, value, name)
        merged = dict(self._values)
        merged.update({k: v for k, v in changes.items() if v is not None})
        return TrainingConfig(merged)

    def get(self, name: str) -> Any:
        """The concrete value of ``name`` (a callable is called and validated), or its default.

        A callable that raises or returns a bad value is reported once and treated as unset:
        telemetry must not take the training job down over a batch-size lambda.
        """
        field = _BY_NAME[name]
        value = self._values.get(name)
        if value is None:
            return field.default
        if not callable(value):
            return value
        try:
            return field.parse(value())
        except Exception as exc:
            self._warn_once(name, f"traintel: {name} callable gave an unusable value ({exc}); ignoring it")
            return field.default

    def is_set(self, name: str) -> bool:
        return name in self._values

    @property
    def has_lazy(self) -> bool:
        """Whether any value is a callable (and so may change between reads)."""
        return any(map(callable, self._values.values()))  # read at every window close

    def is_lazy(self, name: str) -> bool:
        return callable(self._values.get(name))

    def describe(self) -> dict[str, str | int | float]:
        """Values for the ``telemetry_initialization`` event; lazy ones are resolved now."""
        described: dict[str, str | int | float] = {}
        for field in _FIELDS:
            value = self.get(field.name)
            if value is not None:
                described[field.name] = value
        return described

    def _warn_once(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        _logger.warning(message)

    def __repr__(self) -> str:
        return f"TrainingConfig({self._values!r})"
