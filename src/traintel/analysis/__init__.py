"""Offline analysis of exported files (never of live state): summaries, reports, goodput."""

from traintel.analysis.goodput import SessionGoodput, session_goodput
from traintel.analysis.summary import render, summarize

__all__ = ["SessionGoodput", "render", "session_goodput", "summarize"]
