"""Attribute values from training code made into what OpenTelemetry accepts, before the SDK sees them.

Why here and not left to the SDK: training code naturally passes a loss tensor, a numpy batch
size or ``None``. The SDK turns unsupported values into their ``str()`` (``'tensor(16)'``,
so a sample count stops being a number and throughput silently loses it) and logs a warning on
every call — once per step. traintel converts what has one obvious meaning (numpy scalars,
single-element tensors and arrays become Python numbers, via ``.item()``), drops what has none
(``None``, multi-element tensors, arbitrary objects), writes a nested mapping as JSON, and
says so once per kind of value. It
never imports torch or numpy: it duck-types ``.item()`` and the element count.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.util.types import AttributeValue

_logger = logging.getLogger("traintel")
_PLAIN = (str, bool, int, float)
_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(key: str, value: object, what: str) -> None:
    kind = f"{type(value).__module__}.{type(value).__qualname__}:{what}"
    with _warned_lock:
        if kind in _warned:
            return
        _warned.add(kind)
    _logger.warning(
        "traintel: attribute %r: %s value of type %s %s (reported once per type)",
        key, "a" if what == "dropped" else "the", type(value).__name__, what,
    )  # fmt: skip


def _single_element(value: object) -> bool:
    numel = getattr(value, "numel", None)  # torch.Tensor
    if callable(numel):
        return bool(numel() == 1)
    size = getattr(value, "size", None)  # numpy scalars and arrays
    return size == 1


def as_number(value: object) -> int | float | None:
    """A Python int/float for a number, a numpy scalar or a one-element tensor; else None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    item = getattr(value, "item", None)
    if callable(item) and _single_element(value):
        try:
            result = item()
        except Exception:
            return None
        if isinstance(result, int | float) and not isinstance(result, bool):
            return result
    return None


def clean_value(key: str, value: Any) -> AttributeValue | None:
    """The value as OpenTelemetry takes it, or None to drop it (warned once per type)."""
    if isinstance(value, _PLAIN):
        return value
    if value is None:
        _warn_once(key, value, "dropped")
        return None
    number = as_number(value)
    if number is not None:
        _warn_once(key, value, "converted to a Python number")
        return number
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return _clean_sequence(key, value)
    if isinstance(value, Mapping):  # every backend can show JSON; not all show nested maps
        _warn_once(key, value, "converted to a JSON string")
        return json.dumps({str(k): v for k, v in value.items()}, default=str, sort_keys=True)
    _warn_once(key, value, "dropped")
    return None


def _clean_sequence(key: str, value: Sequence[Any]) -> AttributeValue | None:
    """A list of one primitive type, or None (warned once)."""
    items = [clean_value(key, v) for v in value]
    if all(isinstance(i, str) for i in items) or all(isinstance(i, int | float) for i in items):
        return items
    _warn_once(key, value, "dropped (a sequence must hold values of one primitive type)")
    return None


def clean_attributes(attributes: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """A copy holding only values OpenTelemetry accepts (plain values pass untouched)."""
    cleaned: dict[str, AttributeValue] = {}
    for key, value in attributes.items():
        if type(value) in _PLAIN:
            cleaned[key] = value
            continue
        converted = clean_value(key, value)
        if converted is not None:
            cleaned[key] = converted
    return cleaned
