"""Offline analysis of exported files (never of live state)."""
