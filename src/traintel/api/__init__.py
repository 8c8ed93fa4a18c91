"""The instrumentation API: phase context managers, callbacks, model metrics, thread helpers."""
