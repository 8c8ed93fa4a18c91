"""Run Python in a fresh interpreter: for behaviour that involves globals, exit or env-only setup."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


#: What every test's environment holds (conftest) and every child process gets: the suite's
#: loops last milliseconds, so windows close every N iterations (no floor in time) and the
#: export rates count iterations (no stride or tail allowance tied to time).
SUITE_ENV = {
    "TRAINTEL_WINDOW_MIN_SECONDS": "0",
    "TRAINTEL_EXPORT_EVERY_N_SECONDS": "0",
    "TRAINTEL_EXPORT_TAIL_PER_MINUTE": "1e9",
    # a job's last line ("telemetry of this run is in ..."): the tests that want it set 0
    "TRAINTEL_QUIET": "1",
}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRAINTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.update(SUITE_ENV)
    env.update(extra)
    return env


def run_python(
    code: str, cwd: Path, timeout: float = 120, argv: list[str] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    script = cwd / "job.py"
    script.write_text(textwrap.dedent(code))
    command = argv if argv is not None else [sys.executable]
    return subprocess.run(
        [*command, str(script)],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class BlackHole:
    """A TCP port that completes handshakes (the kernel does) but never reads or answers."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self._held.append(conn)  # hold it open, never read

    def __enter__(self) -> BlackHole:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self._held:
            conn.close()
        self.sock.close()


def wait_for(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False
