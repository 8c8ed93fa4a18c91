"""The runtime: process state, bootstrap (wiring through constructors, in one place), preemption.

Importing any of it registers, through the bootstrap, how the recorder configures a job from the
environment on first use: the callbacks and integrations reach the recorder through here
without ``import traintel`` having loaded it.
"""

from traintel._runtime import bootstrap as _bootstrap  # noqa: F401 - registers first use
