"""What a resource stands for (its run, its process), worked out once per resource.

Why by identity: the reader hands every record of one process the very same resource dict, and
a collector's node file interleaves a few processes' lines, so "the same resource as the last
record" misses at every other line. A small map from each dict seen to what it stands for
answers every record at the cost of one lookup. The dict is kept with its answer, so that its
id cannot be reused by another while the answer is held.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")
#: Resources remembered at most (a damaged file read the proto way yields a new dict per line).
_LIMIT = 4096


class PerResource(Generic[V]):
    """``of(resource)``: what ``make(resource)`` said for this very dict, made once."""

    __slots__ = ("_make", "_seen")

    def __init__(self, make: Callable[[dict[str, Any]], V]) -> None:
        self._make = make
        self._seen: dict[int, tuple[dict[str, Any], V]] = {}

    def __call__(self, resource: dict[str, Any]) -> V:
        entry = self._seen.get(id(resource))
        if entry is not None and entry[0] is resource:
            return entry[1]
        if len(self._seen) >= _LIMIT:
            self._seen.clear()
        value = self._make(resource)
        self._seen[id(resource)] = (resource, value)
        return value

    def clear(self) -> None:
        """Forget every answer (what they point to was merged away)."""
        self._seen.clear()

    def __getstate__(self) -> Callable[[dict[str, Any]], V]:  # sent between processes without answers
        return self._make

    def __setstate__(self, make: Callable[[dict[str, Any]], V]) -> None:
        self._make, self._seen = make, {}
