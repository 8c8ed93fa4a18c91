"""The test suite (a package, so tests import their helpers as ``tests.*``).

One intra-op thread per torch process (test workers, jobs and ranks inherit it): the suite runs
several at once, and OpenMP threads spinning on an oversubscribed machine slow a step tenfold.
Set here, before any test module imports torch; a developer's own setting wins.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
