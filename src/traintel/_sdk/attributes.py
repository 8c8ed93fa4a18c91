"""Attribute values from training code made into what OpenTelemetry accepts, before the SDK sees them.

Why here and not left to the SDK: training code naturally passes a loss tensor, a numpy batch
size or ``None``. The SDK turns unsupported values into their ``str()`` (``'tensor(16)'``,
so a sample count stops being a number and throughput silently loses it) and logs a warning on
every call — once per step. traintel converts what has one obvious meaning (numpy scalars,
single-element tensors and arrays become Python numbers, via ``.item()``), drops what has none
(``None``, multi-element tensors, arbitrary objects), writes a nested mapping as JSON, and
says so once per kind of value. It never imports torch or numpy: it duck-types ``.item()`` and
the element count.

The conversion is total: whatever the value, :func:`clean_value` returns a valid attribute or
``None`` (dropped, said once), and never raises (a dict nested 1,000 deep or holding itself
would make ``json`` raise): a mapping beyond the limits below or containing itself is dropped,
as is a sequence too long or not of one primitive kind (ints and floats mixed become floats).
An integer beyond int64 becomes its decimal string.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.util.types import AttributeValue

_logger = logging.getLogger("traintel")
_PLAIN = (str, bool, int, float)
_warned: set[str] = set()
_warned_lock = threading.Lock()

#: How deep a mapping may nest to be written as JSON.
MAX_DEPTH = 16
#: How many items a sequence, or a mapping counting every nested item, may hold.
MAX_ITEMS = 10_000
#: The longest JSON string a mapping becomes.
MAX_JSON_CHARS = 65_536
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class _Unconvertible(Exception):
    """Why a value has no attribute form (it is then dropped, and that said)."""


def _warn_once(key: object, value: object, what: str) -> None:
    try:
        kind = f"{type(value).__module__}.{type(value).__qualname__}:{what}"
        with _warned_lock:
            if kind in _warned:
                return
            _warned.add(kind)
        name = key if isinstance(key, str) else f"<{type(key).__name__} key>"
        _logger.warning(
            "traintel: attribute %r: %s value of type %s %s (reported once per type)",
            name, "a" if what.startswith("dropped") else "the", type(value).__name__, what,
        )  # fmt: skip
    except Exception:  # saying it must not be what fails
        pass


def _single_element(value: object) -> bool:
    numel = getattr(value, "numel", None)  # torch.Tensor
    if callable(numel):
        return bool(numel() == 1)
    size = getattr(value, "size", None)  # numpy scalars and arrays
    return bool(size == 1) if isinstance(size, int) else False


def as_number(value: object) -> int | float | None:
    """A Python int/float for a number, a numpy scalar or a one-element tensor; else None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    try:
        item = getattr(value, "item", None)
        if callable(item) and _single_element(value):
            result = item()
            if isinstance(result, int | float) and not isinstance(result, bool):
                return result
    except Exception:
        return None
    return None


def _int(value: int) -> int | str:
    """An int as OTLP carries it: beyond int64 no encoder takes it; its digits stay exact."""
    return int(value) if _INT64_MIN <= value <= _INT64_MAX else str(value)


def clean_value(key: str, value: Any) -> AttributeValue | None:
    """The value as OpenTelemetry takes it, or None to drop it (warned once per type). Never
    raises."""
    try:
        return _clean(key, value)
    except _Unconvertible as why:
        _warn_once(key, value, f"dropped ({why})")
    except Exception as exc:  # a value whose own methods fail (__len__, __iter__, __str__)
        _warn_once(key, value, f"dropped (converting it raised {type(exc).__name__})")
    return None


def _clean(key: str, value: Any) -> AttributeValue | None:
    if isinstance(value, bool | str | float):
        return value
    if isinstance(value, int):
        return _clean_int(key, value)
    if value is None:
        _warn_once(key, value, "dropped")
        return None
    number = as_number(value)
    if number is not None:
        _warn_once(key, value, "converted to a Python number")
        return _int(number) if isinstance(number, int) else number
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return _clean_sequence(key, value)
    if isinstance(value, Mapping):  # every backend can show JSON; not all show nested maps
        return _json_text(key, value)
    raise _Unconvertible("no attribute form")


def _clean_int(key: str, value: int) -> int | str:
    cleaned = _int(value)
    if isinstance(cleaned, str):
        _warn_once(key, value, "converted to a string (beyond int64)")
    return cleaned


def _json_text(key: str, value: Mapping[Any, Any]) -> str:
    text = json.dumps(_jsonable(value, 0, set(), [MAX_ITEMS]), sort_keys=True)
    if len(text) > MAX_JSON_CHARS:
        raise _Unconvertible(f"its JSON is over {MAX_JSON_CHARS:,} characters")
    _warn_once(key, value, "converted to a JSON string")
    return text


def _clean_sequence(key: str, value: Sequence[Any]) -> AttributeValue | None:
    """A list of one primitive type (ints and floats together become floats), or None."""
    if len(value) > MAX_ITEMS:
        raise _Unconvertible(f"more than {MAX_ITEMS:,} items")
    return _one_kind([_primitive(item) for item in value])


def _one_kind(items: list[Any]) -> list[Any]:
    """Values of one kind: bools, strings, or numbers (ints where all are within int64)."""
    kinds = set(map(_kind, items))
    if len(kinds) > 1:
        raise _Unconvertible("a sequence must hold values of one primitive type")
    if kinds != {float}:
        return items
    if all(isinstance(i, int) and _INT64_MIN <= i <= _INT64_MAX for i in items):
        return [int(i) for i in items]
    return [float(i) for i in items]  # mixed with floats, or beyond int64: one kind, floats


def _kind(item: Any) -> type:
    return bool if type(item) is bool else str if isinstance(item, str) else float


def _primitive(item: Any) -> Any:
    if isinstance(item, bool | str | float | int):
        return item
    number = as_number(item)
    if number is None:
        raise _Unconvertible("a sequence must hold values of one primitive type")
    return number


def _jsonable(value: Any, depth: int, seen: set[int], budget: list[int]) -> Any:
    """A JSON-ready copy of ``value``: bounded in depth and items, without cycles."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _Unconvertible(f"more than {MAX_ITEMS:,} nested items")
    if value is None or isinstance(value, bool | str):
        return value
    number = as_number(value)  # an int, a float, a numpy scalar, a one-element tensor
    if number is not None:
        return number if isinstance(number, int) or math.isfinite(number) else str(number)
    if isinstance(value, Mapping | list | tuple):
        return _jsonable_container(value, depth, seen, budget)
    return str(value)[:MAX_JSON_CHARS]


def _jsonable_container(value: Any, depth: int, seen: set[int], budget: list[int]) -> Any:
    if depth >= MAX_DEPTH:
        raise _Unconvertible(f"nested deeper than {MAX_DEPTH}")
    if id(value) in seen:
        raise _Unconvertible("it contains itself")
    seen.add(id(value))
    try:
        if isinstance(value, Mapping):
            return {str(k): _jsonable(v, depth + 1, seen, budget) for k, v in value.items()}
        return [_jsonable(v, depth + 1, seen, budget) for v in value]
    finally:
        seen.discard(id(value))


def clean_attributes(attributes: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """A copy holding only values OpenTelemetry accepts (plain values pass untouched); a key
    that is not a non-empty string is dropped, said once. Never raises."""
    cleaned: dict[str, AttributeValue] = {}
    try:
        items = list(attributes.items())
    except Exception as exc:
        _warn_once("attributes", attributes, f"dropped (reading them raised {type(exc).__name__})")
        return cleaned
    for key, value in items:
        if not isinstance(key, str) or not key:
            _warn_once(key, value, "dropped (its key is not a non-empty string)")
            continue
        if type(value) in _PLAIN and (type(value) is not int or _INT64_MIN <= value <= _INT64_MAX):
            cleaned[key] = value
            continue
        converted = clean_value(key, value)
        if converted is not None:
            cleaned[key] = converted
    return cleaned


class UserNamesCap:
    """traintel's own attributes first: a span or event whose attributes would pass the tracer's
    count limit leaves out the user's metric names (the last first) instead.

    Why: the SDK keeps a span's newest attributes and drops the oldest, and a window record
    holds traintel's numbers first and two per ``record_metrics`` name after them; past about
    51 names (one gradient norm per layer is common) the window's own numbers went, and goodput
    read 0.00 %, with one SDK warning per dropped attribute. Here the names that do not fit are
    left out of that record (the iteration spans keep theirs while they fit), and said once
    with their count. Costs a length check when everything fits.
    """

    def __init__(
        self, span_limit: int | None, event_limit: int | None, warn_once: Callable[..., None]
    ) -> None:
        self.span_limit = span_limit
        self.event_limit = event_limit
        self._warn_once = warn_once

    def span(self, attributes: dict[str, Any], prefix: str, what: str) -> dict[str, Any]:
        return self._fit(attributes, prefix, what, self.span_limit, "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT")

    def event(self, attributes: dict[str, Any], prefix: str, what: str) -> dict[str, Any]:
        return self._fit(attributes, prefix, what, self.event_limit, "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT")

    def _fit(
        self, attributes: dict[str, Any], prefix: str, what: str, limit: int | None, variable: str
    ) -> dict[str, Any]:
        if limit is None or len(attributes) <= limit:
            return attributes
        by_name: dict[str, list[str]] = {}
        for key in attributes:
            if key.startswith(prefix):
                name = key[len(prefix) :].removesuffix(".last").removesuffix(".mean")
                by_name.setdefault(name, []).append(key)
        kept = dict(attributes)
        left_out: list[str] = []
        for name, keys in reversed(by_name.items()):
            if len(kept) <= limit:
                break
            for key in keys:
                del kept[key]
            left_out.append(name)
        if left_out:
            named = ", ".join(left_out[:3] + ["..."] * (len(left_out) > 3))
            self._warn_once(
                "user_names_cap:" + what,
                "%d record_metrics names do not fit in a %s with traintel's own numbers (at most %d "
                "attributes: %s or OTEL_ATTRIBUTE_COUNT_LIMIT); the last %d are left out of it (%s), "
                "traintel's numbers kept",
                len(by_name), what, limit, variable, len(left_out), named,
            )  # fmt: skip
        return kept
