"""Ids forced for the next span of one thread, and only that span, only on that thread."""

from __future__ import annotations

import random
import threading

from traintel._sdk.ids import ForcingIdGenerator, new_span_id, new_trace_id


def test_a_forced_id_goes_to_the_next_span_of_its_thread_only() -> None:
    ids = ForcingIdGenerator()
    seen_elsewhere: list[int] = []
    ids.force(0xABC, 0xDEF)
    thread = threading.Thread(target=lambda: seen_elsewhere.append(ids.generate_span_id()))
    thread.start()
    thread.join()
    assert seen_elsewhere[0] not in (0, 0xABC)  # another thread draws a random id
    assert ids.generate_span_id() == 0xABC
    assert ids.generate_trace_id() == 0xDEF
    assert ids.generate_span_id() not in (0, 0xABC)  # once only
    assert ids.generate_trace_id() not in (0, 0xDEF)


def test_a_thread_that_never_forced_draws_random_ids_and_clear_undoes_a_force() -> None:
    ids = ForcingIdGenerator()
    drawn = {ids.generate_span_id() for _ in range(100)}
    assert len(drawn) == 100 and 0 not in drawn
    ids.force(7)
    ids.clear()
    assert ids.generate_span_id() != 7


def test_ids_do_not_repeat_when_the_random_module_is_reseeded() -> None:
    """Training code seeds ``random`` (the same seed on every rank) and restores its state."""
    ids = ForcingIdGenerator()
    drawn = []
    for _ in range(2):
        random.seed(0)
        drawn.append((new_span_id(), new_trace_id(), ids.generate_span_id(), ids.generate_trace_id()))
    assert drawn[0][0] != drawn[1][0] and drawn[0][1] != drawn[1][1]
    assert drawn[0][2] != drawn[1][2] and drawn[0][3] != drawn[1][3]
