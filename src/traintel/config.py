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

import argparse
import dataclasses
import difflib
import functools
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final

from traintel import environment_variables as ev

_logger = logging.getLogger(__name__)

#: Compute dtypes the peak-FLOPs table knows.
DTYPES: Final = ("fp32", "tf32", "bf16", "fp16", "fp8")


class ConfigurationError(ValueError):
    """A configuration value is invalid; the message names the setting and the bad value."""


def _integer(raw: object, *, least: int, wanted: str) -> int:
    """``raw`` as a whole number of at least ``least``: a string parsed, an integral float
    taken, a bool refused (``wanted`` names the kind in the error)."""
    value = raw
    if isinstance(raw, str):
        try:
            value = int(raw.strip())
        except ValueError:
            value = None
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"expected {wanted} integer")
    return value


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
    value = _float_or_nan(raw)
    if not (value > 0 or (allow_zero and value == 0)) or math.isinf(value):
        raise ValueError(f"expected {'a non-negative number' if allow_zero else 'a positive number'}")
    return value


def _float_or_nan(raw: object) -> float:
    """``raw`` as a number (a string parsed); NaN for anything else, a bool included."""
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            return math.nan
    return float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else math.nan


_positive_number = functools.partial(_number, allow_zero=False)
_non_negative_number = functools.partial(_number, allow_zero=True)
_positive_int = functools.partial(_integer, least=1, wanted="a positive")
_non_negative_int = functools.partial(_integer, least=0, wanted="a non-negative")


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


#: A hyper-parameter's value: what an attribute holds and a report shows.
HyperparameterValue = str | bool | int | float


def _hyperparameters(raw: object) -> tuple[tuple[str, HyperparameterValue], ...]:
    """Names to numbers, strings or booleans (sections and lists of them, see :func:`_flatten`),
    as a mapping (from the environment, a JSON object), kept as sorted pairs: immutable, and
    the same whatever order they were given in."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise ValueError("expected a JSON object of names to numbers, strings or booleans") from None
    if isinstance(raw, tuple):  # (parsed before: a copy of the configuration checks it again)
        raw = dict(raw)
    if isinstance(raw, argparse.Namespace):  # a script's parsed arguments, as they are
        raw = vars(raw)
    elif dataclasses.is_dataclass(raw) and not isinstance(raw, type):
        raw = dataclasses.asdict(raw)
    if not isinstance(raw, Mapping):
        raise ValueError("expected a mapping of names to numbers, strings or booleans")
    pairs: dict[str, HyperparameterValue] = {}
    _flatten(raw, "", pairs)
    return tuple(sorted(pairs.items()))


def _flatten(raw: Mapping[object, object], prefix: str, into: dict[str, HyperparameterValue]) -> None:
    """A nested section (a Hydra or YAML config's ``optimizer: {name: adamw}``) as dotted names
    (``optimizer.name``); a list of plain values (``betas: [0.9, 0.95]``) as its JSON text; a
    None left out."""
    for name, value in raw.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"hyper-parameter name {name!r} is not a non-empty string")
        key = prefix + name.strip()
        if value is None:  # an option not given (``--resume`` left out): no value to show
            continue
        if isinstance(value, Mapping):
            _flatten(value, key + ".", into)
        elif isinstance(value, str | bool | int | float):
            into[key] = value
        elif _plain_list(value):
            into[key] = json.dumps(list(value))  # type: ignore[call-overload]
        else:
            raise ValueError(
                f"hyper-parameter {key}={value!r} is not a number, string, boolean or a list of them"
            )


def _plain_list(value: object) -> bool:
    """A list of numbers, strings or booleans (a list, a tuple, OmegaConf's ``ListConfig``)."""
    plain = str | bool | int | float
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str | bytes)
        and all(isinstance(v, plain) for v in value)
    )


def _setting(env: str, parse: Callable[[object], Any], default: Any = None, *, eager: bool = False) -> Any:
    """A field of :class:`Settings`: its variable and parser beside its type. ``eager``: needed
    concrete when telemetry starts (it shapes files and exit), never lazy."""
    return field(default=default, metadata={"env": env, "parse": parse, "eager": eager})


@dataclass(frozen=True)
class Settings:
    """Every training fact and knob, typed and resolved (a lazy value is called and checked).

    One is built from a :class:`TrainingConfig` at configure, and again once per window when the
    configuration holds callables; everything reads its attributes, never a setting by name."""

    session_tag: str | None = _setting(ev.TRAINTEL_SESSION_TAG, _non_empty_str, eager=True)
    perf_tag: str | None = _setting(ev.TRAINTEL_PERF_TAG, _non_empty_str)
    hyperparameters: tuple[tuple[str, HyperparameterValue], ...] | None = _setting(
        ev.TRAINTEL_HYPERPARAMETERS, _hyperparameters
    )
    run_id: str | None = _setting(ev.TRAINTEL_RUN_ID, _non_empty_str, eager=True)
    global_batch_size: int | None = _setting(ev.TRAINTEL_GLOBAL_BATCH_SIZE, _positive_int)
    seq_len: int | None = _setting(ev.TRAINTEL_SEQ_LEN, _positive_int)
    flops_per_sample: float | None = _setting(ev.TRAINTEL_FLOPS_PER_SAMPLE, _positive_number)
    flops_per_token: float | None = _setting(ev.TRAINTEL_FLOPS_PER_TOKEN, _positive_number)
    executed_flops_per_sample: float | None = _setting(
        ev.TRAINTEL_EXECUTED_FLOPS_PER_SAMPLE, _positive_number
    )
    peak_flops: float | None = _setting(ev.TRAINTEL_PEAK_FLOPS, _positive_number)
    log_every_n_iterations: int = _setting(ev.TRAINTEL_LOG_EVERY_N_ITERATIONS, _positive_int, 50, eager=True)
    window_min_seconds: float = _setting(
        ev.TRAINTEL_WINDOW_MIN_SECONDS, _non_negative_number, 30.0, eager=True
    )
    log_every_n_seconds: float = _setting(ev.TRAINTEL_LOG_EVERY_N_SECONDS, _positive_number, 60.0, eager=True)
    output_dir: str = _setting(ev.TRAINTEL_OUTPUT_DIR, _non_empty_str, "traintel-runs", eager=True)
    shutdown_timeout: float = _setting(ev.TRAINTEL_SHUTDOWN_TIMEOUT, _exit_seconds, 5.0, eager=True)
    stall_seconds: float = _setting(ev.TRAINTEL_STALL_SECONDS, _exit_seconds, 30.0, eager=True)
    warmup_iterations: int = _setting(ev.TRAINTEL_WARMUP_ITERATIONS, _non_negative_int, 1, eager=True)
    dtype: str | None = _setting(ev.TRAINTEL_DTYPE, _choice(*DTYPES))
    flops_method: str | None = _setting(
        ev.TRAINTEL_FLOPS_METHOD, _choice("config", "formula", "counter", "counter+attention", "callable")
    )
    export_iterations: str = _setting(
        ev.TRAINTEL_EXPORT_ITERATIONS, _choice("sampled", "all", "none"), "sampled", eager=True
    )
    export_first_iterations: int = _setting(
        ev.TRAINTEL_EXPORT_FIRST_ITERATIONS, _non_negative_int, 10, eager=True
    )
    export_every_n_iterations: int = _setting(
        ev.TRAINTEL_EXPORT_EVERY_N_ITERATIONS, _non_negative_int, 100, eager=True
    )
    export_every_n_seconds: float = _setting(
        ev.TRAINTEL_EXPORT_EVERY_N_SECONDS, _non_negative_number, 60.0, eager=True
    )
    export_tail_per_minute: float = _setting(
        ev.TRAINTEL_EXPORT_TAIL_PER_MINUTE, _non_negative_number, 1.0, eager=True
    )
    window_events: str = _setting(ev.TRAINTEL_WINDOW_EVENTS, _choice("off", "on"), "off", eager=True)
    slow_iteration_factor: float = _setting(ev.TRAINTEL_SLOW_ITERATION_FACTOR, _factor, 3.0, eager=True)
    segment_iterations: int | None = _setting(ev.TRAINTEL_SEGMENT_ITERATIONS, _positive_int, eager=True)
    segment_seconds: float = _setting(ev.TRAINTEL_SEGMENT_SECONDS, _positive_number, 600.0, eager=True)
    max_spans_per_trace: int = _setting(ev.TRAINTEL_MAX_SPANS_PER_TRACE, _positive_int, 2000, eager=True)
    max_bytes_per_trace: int = _setting(ev.TRAINTEL_MAX_BYTES_PER_TRACE, _positive_int, 4_000_000, eager=True)
    cross_rank: str = _setting(ev.TRAINTEL_CROSS_RANK, _choice("auto", "off"), "auto")
    cross_rank_timeout: float = _setting(ev.TRAINTEL_CROSS_RANK_TIMEOUT, _exchange_seconds, 30.0)
    cross_rank_scale_world_size: int = _setting(ev.TRAINTEL_CROSS_RANK_SCALE_WORLD_SIZE, _positive_int, 64)
    cross_rank_top_k: int = _setting(ev.TRAINTEL_CROSS_RANK_TOP_K, _positive_int, 3)
    straggler_factor: float = _setting(ev.TRAINTEL_STRAGGLER_FACTOR, _factor, 1.25)
    cuda_event_timing: str = _setting(ev.TRAINTEL_CUDA_EVENT_TIMING, _choice("off", "on"), "off", eager=True)
    nvtx: str = _setting(ev.TRAINTEL_NVTX, _choice("off", "on"), "off", eager=True)
    measure_peak: str = _setting(ev.TRAINTEL_MEASURE_PEAK, _choice("off", "on"), "off")
    energy_price_per_kwh: float | None = _setting(ev.TRAINTEL_ENERGY_PRICE_PER_KWH, _positive_number)
    spool_dir: str | None = _setting(ev.TRAINTEL_SPOOL_DIR, _non_empty_str, eager=True)
    spool_max_bytes: int = _setting(ev.TRAINTEL_SPOOL_MAX_BYTES, _non_negative_int, 268_435_456, eager=True)
    spool_retry_interval: float = _setting(
        ev.TRAINTEL_SPOOL_RETRY_INTERVAL, _positive_number, 5.0, eager=True
    )

    @property
    def window_seconds(self) -> tuple[float, float]:
        """A window's floor and ceiling in seconds; the floor is at most the ceiling (it wins)."""
        ceiling = self.log_every_n_seconds
        return min(self.window_min_seconds, ceiling), ceiling


_FIELDS: Final = {f.name: f for f in fields(Settings)}
#: Names accepted by ``configure()`` / ``set_training_config()`` as training facts.
FIELD_NAMES: Final = tuple(_FIELDS)
#: Each ``TRAINTEL_*`` variable's default, where it has one: what the documentation shows.
DEFAULTS: Final = {f.metadata["env"]: f.default for f in _FIELDS.values() if f.default is not None}
_DEFAULTS: Final = Settings()


def _unknown(name: str) -> ConfigurationError:
    """The error for a setting that does not exist, with the nearest one (``seq_length``: did
    you mean ``seq_len``?) before the list of all of them."""
    near = difflib.get_close_matches(name, FIELD_NAMES, 1, 0.6)
    hint = f"; did you mean {near[0]}?" if near else ""
    return ConfigurationError(
        f"{name}: unknown training config setting{hint} (known: {', '.join(FIELD_NAMES)})"
    )


#: The unknown ``TRAINTEL_*`` variables said so far (once each per process).
_said_unknown: set[str] = set()


def _say_unknown_variables(environ: Mapping[str, str]) -> None:
    """Each ``TRAINTEL_*`` variable traintel does not read, said once with the nearest one it
    reads: a misspelt one (``TRAINTEL_WARMUP_ITERATION=3``) left the default in use, unsaid.
    And each ``OTEL_*`` variable a letter or two from one of the OpenTelemetry SDK's
    (``OTEL_TRACE_EXPORTER=otlp``: the spans stayed in the local file, unsaid); one near none is
    left alone, as instrumentations and other tools read ``OTEL_*`` names of their own."""
    for variable in sorted(set(environ) - _said_unknown):
        if variable.startswith("TRAINTEL_") and variable not in ev.ALL:
            _said_unknown.add(variable)
            prefix = len("TRAINTEL_")  # (compared without it: every name shares it)
            near = difflib.get_close_matches(variable[prefix:], [v[prefix:] for v in ev.ALL], 1, 0.8)
            hint = f" (did you mean TRAINTEL_{near[0]}?)" if near else ""
            _logger.warning("traintel: %s is not a traintel variable%s; it is ignored", variable, hint)
        elif variable.startswith("OTEL_") and variable not in _otel_variables():
            _said_unknown.add(variable)
            near = difflib.get_close_matches(variable, _otel_variables(), 1, 0.9)
            if near:
                _logger.warning(
                    "traintel: %s is not an OpenTelemetry variable (did you mean %s?); it is ignored",
                    variable,
                    near[0],
                )


@functools.cache
def _otel_variables() -> frozenset[str]:
    """The variables the OpenTelemetry API and SDK name (the SDK's ``environment_variables``)."""
    from opentelemetry import environment_variables as api
    from opentelemetry.sdk import environment_variables as sdk

    names = (value for module in (api, sdk) for value in vars(module).values())
    return frozenset(name for name in names if isinstance(name, str) and name.startswith("OTEL_"))


def _check(name: str, value: object, source: str) -> object:
    """Validate ``value`` for setting ``name``; callables pass (they are checked when resolved)."""
    meta = _FIELDS[name].metadata
    if callable(value):
        if meta["eager"]:
            raise ConfigurationError(f"{source}: {name} cannot be a callable, it is needed at start")
        return value
    try:
        return meta["parse"](value)
    except ValueError as exc:
        raise ConfigurationError(f"{source}={value!r}: {exc}") from None


def _given(environ: Mapping[str, str], overrides: Mapping[str, object]) -> list[tuple[str, object, str]]:
    """(setting, value, where it came from) of each variable set, then of each override."""
    given: list[tuple[str, object, str]] = [
        (name, environ[f.metadata["env"]], f.metadata["env"])
        for name, f in _FIELDS.items()
        if environ.get(f.metadata["env"], "").strip()
    ]
    return given + [(name, value, name) for name, value in overrides.items()]


class TrainingConfig:
    """An immutable set of training facts as given; each value is concrete, lazy (callable) or
    unset. Build one with :meth:`from_env`, derive updated copies with :meth:`updated`, and read
    it through :meth:`resolve`, which calls the lazy values and never raises."""

    __slots__ = ("_lock", "_values", "_warned", "has_lazy")

    def __init__(self, values: Mapping[str, object] | None = None) -> None:
        self._values: dict[str, object] = {}
        for name, value in (values or {}).items():
            if name not in _FIELDS:
                raise _unknown(name)
            if value is not None:
                self._values[name] = _check(name, value, name)
        #: Whether any value is a callable (and so may change between resolutions).
        self.has_lazy = any(map(callable, self._values.values()))
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
        values: dict[str, object] = {}
        environ = os.environ if environ is None else environ
        _say_unknown_variables(environ)
        for name, value, source in _given(environ, overrides or {}):
            try:
                if name not in _FIELDS:
                    raise _unknown(name)
                if value is not None:
                    values[name] = _check(name, value, source)
            except ConfigurationError as exc:
                if strict:
                    raise
                _logger.error("traintel: ignoring bad setting: %s", exc)
        return cls(values)

    def updated(self, **changes: object) -> TrainingConfig:
        """A copy with ``changes`` applied; raises :class:`ConfigurationError` on a bad value,
        changing nothing (the copy validates them)."""
        merged = dict(self._values)
        for name, value in changes.items():
            if name not in _FIELDS:
                raise _unknown(name)
            if value is not None:
                merged[name] = value
        return TrainingConfig(merged)

    def resolve(self, *, lazy: bool = True) -> Settings:
        """Every value, concrete: a callable is called and validated; one that raises or
        returns a bad value is reported once and treated as unset (telemetry must not take the
        training job down over a batch-size lambda). ``lazy=False``: callables are not called,
        their settings read as unset."""
        values: dict[str, Any] = {
            name: self._value(name) for name, value in self._values.items() if lazy or not callable(value)
        }
        if "log_every_n_iterations" in values and "window_min_seconds" not in values:
            # The floor's default guards against a window per 50 fast steps nobody asked for; a
            # window size the user chose is what they get (the floor too, if they set it).
            values["window_min_seconds"] = 0.0
        return dataclasses.replace(_DEFAULTS, **values) if values else _DEFAULTS

    def _value(self, name: str) -> object:
        value = self._values[name]
        if not callable(value):
            return value
        try:
            return _FIELDS[name].metadata["parse"](value())
        except Exception as exc:
            self._warn_once(name, f"traintel: {name} callable gave an unusable value ({exc}); ignoring it")
            return _FIELDS[name].default

    def is_lazy(self, name: str) -> bool:
        return callable(self._values.get(name))

    def describe(self, settings: Settings | None = None) -> dict[str, HyperparameterValue]:
        """Values for the ``telemetry_initialization`` event (lazy ones resolved now, or as in
        ``settings``); each hyper-parameter is one value, ``hyperparameters.<name>``."""
        settings = self.resolve() if settings is None else settings
        described: dict[str, HyperparameterValue] = {}
        for name in FIELD_NAMES:
            value = getattr(settings, name)
            if name == "hyperparameters" and value is not None:
                described.update({f"{name}.{key}": item for key, item in value})
            elif value is not None:
                described[name] = value
        return described

    def _warn_once(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        _logger.warning(message)

    def __repr__(self) -> str:
        return f"TrainingConfig({self._values!r})"
