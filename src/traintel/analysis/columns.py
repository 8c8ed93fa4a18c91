"""Rows of numbers kept in typed arrays: per-window and per-span state of a large job, compact.

Why: the goodput analysis must keep every window record of every rank (its per-rank timelines
need them all), the parent link of every exported span (data loading inside an iteration is
told apart by its ancestors) and every exported iteration. As Python tuples of ints and floats
that is some 400 bytes a row: a 64-rank job of a million iterations per rank would need
gigabytes. In :mod:`array` columns a value takes its 8 bytes.

A row that does not fit its columns (an integer outside 64 bits, a None, an id of an unusual
length kept as text) is kept aside as the tuple it is, at its place: every row reads back exactly
as it was appended, in order.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

#: Rows packed into the columns at a time.
_BATCH = 256


class Table:
    """Append-only rows of numbers, one :class:`array.array` per column (typecodes as given).

    Rows are packed a batch at a time (a column takes a batch's values in one C call); the
    batch waits in a short list until then."""

    __slots__ = ("_codes", "_pending", "columns", "odd", "rows")

    def __init__(self, codes: str) -> None:
        self._codes = codes
        self.columns = [array(code) for code in codes]
        #: Rows that did not fit, by position (their column slots hold zeros).
        self.odd: dict[int, tuple[Any, ...]] = {}
        self.rows = 0
        self._pending: list[tuple[Any, ...]] = []

    def append(self, row: tuple[Any, ...]) -> None:
        pending = self._pending
        pending.append(row)
        if len(pending) >= _BATCH:
            self._pack()

    def _pack(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            packed = [
                array(code, values)
                for code, values in zip(self._codes, zip(*batch, strict=True), strict=True)
            ]
        except (OverflowError, TypeError, ValueError):  # an odd row among them (or a short one)
            for row in batch:
                self._append_one(row)
            return
        for column, values in zip(self.columns, packed, strict=True):
            column.extend(values)
        self.rows += len(batch)

    def _append_one(self, row: tuple[Any, ...]) -> None:
        rows = self.rows
        try:
            for column, value in zip(self.columns, row):  # noqa: B905 - rows have the columns' length
                column.append(value)
        except (OverflowError, TypeError):
            for column in self.columns:
                if len(column) > rows:
                    column.pop()
                column.append(0)
            self.odd[rows] = row
        self.rows = rows + 1

    def extend(self, other: Table) -> None:
        """``other``'s rows after this one's (merging the partial tables of two files)."""
        self._pack()
        other._pack()
        for column, more in zip(self.columns, other.columns, strict=True):
            column.extend(more)
        for position, row in other.odd.items():
            self.odd[self.rows + position] = row
        self.rows += other.rows

    def __len__(self) -> int:
        return self.rows + len(self._pending)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        self._pack()
        odd = self.odd
        if not odd:
            yield from zip(*self.columns, strict=True)
            return
        for position, row in enumerate(zip(*self.columns, strict=True)):
            yield odd.get(position, row)

    def __getstate__(self) -> tuple[Any, ...]:  # sent between processes packed
        self._pack()
        return (self._codes, self.columns, self.odd, self.rows)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self._codes, self.columns, self.odd, self.rows = state
        self._pending = []

    def clear(self) -> None:
        self.columns = [array(code) for code in self._codes]
        self.odd = {}
        self.rows = 0
        self._pending = []
