"""Trace ids as links into the user's trace backend (``TRAINTEL_TRACE_URL``).

Why a template and not a backend setting: Jaeger, Tempo behind Grafana, Honeycomb and the rest
each spell a trace's page differently, and the user knows theirs; a template with
``{trace_id}`` (and optionally ``{span_id}``) covers them all without traintel knowing any.
"""

from __future__ import annotations

import os
from urllib.parse import quote

from traintel.environment_variables import TRAINTEL_TRACE_URL


class TraceLinks:
    """``url(trace_id, span_id)`` from the template, or None where no template is set."""

    def __init__(self, template: str | None) -> None:
        if template is not None and "{trace_id}" not in template:
            raise ValueError(
                f"{TRAINTEL_TRACE_URL} must contain {{trace_id}} (e.g. "
                f"http://localhost:16686/trace/{{trace_id}}), got {template!r}"
            )
        self.template = template

    @classmethod
    def from_env(cls) -> TraceLinks:
        """From ``TRAINTEL_TRACE_URL``; ValueError naming the variable for a bad one."""
        return cls(os.environ.get(TRAINTEL_TRACE_URL) or None)

    def url(self, trace_id: str, span_id: str = "") -> str | None:
        if self.template is None or not trace_id:
            return None
        # ids are hex from the reader; quoted all the same, as they end up in a page's href
        return self.template.replace("{trace_id}", quote(trace_id, safe="")).replace(
            "{span_id}", quote(span_id, safe="")
        )
