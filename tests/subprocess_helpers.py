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
#: export rates count iterations (no stride or tail allowance tied to time). The exit bound and
#: the OTLP exporters' timeout are hang guards: a busy machine may need more than their defaults
#: (5 s, 10 s) for a job's last collection or a healthy collector's answer, and a test must not
#: lose data to that; the tests of the bound and of timeouts set their own.
SUITE_ENV = {
    "TRAINTEL_WINDOW_MIN_SECONDS": "0",
    "TRAINTEL_EXPORT_EVERY_N_SECONDS": "0",
    "TRAINTEL_EXPORT_TAIL_PER_MINUTE": "1e9",
    # a job's last line ("telemetry of this run is in ..."): the tests that want it set 0
    "TRAINTEL_QUIET": "1",
    "TRAINTEL_SHUTDOWN_TIMEOUT": "120",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "120",
}


#: Appended to a child's script by :func:`with_exit_clock`: the moment the script ended (its exit
#: begins: threads joined, atexit hooks, traintel's bounded shutdown and the SDK's, interpreter
#: teardown), written next to the job. ``time.monotonic`` is the machine's one monotonic clock,
#: so the test reads the exit's length against it when it sees the process gone.
_EXIT_CLOCK_END = """
import os as _exit_clock_os, time as _exit_clock_time
with open(_exit_clock_os.path.join(_EXIT_CLOCK_DIR, "script_ended"), "w") as _exit_clock_out:
    _exit_clock_out.write(repr(_exit_clock_time.monotonic()))
"""


def with_exit_clock(code: str) -> str:
    """``code`` that says when its script ended (see :func:`exit_seconds`)."""
    return (
        "import os as _exit_clock_os\n_EXIT_CLOCK_DIR = _exit_clock_os.getcwd()\n"
        + textwrap.dedent(code)
        + _EXIT_CLOCK_END
    )


def exit_seconds(cwd: Path) -> float:
    """How long the exit of a :func:`with_exit_clock` job started in ``cwd`` took: from the end of
    its script to now. Call it as soon as the process has ended.

    Exit bounds are checked against it and the job's own configuration: the exit never waits a
    send out (it ends before the exporter's timeout), or waits at most traintel's bound plus the
    one send under way (which the exporter's timeout bounds). Never against a number of wall
    seconds for the whole run, which interpreter start, imports and training on a busy machine
    inflate."""
    now = time.monotonic()
    written = cwd / "script_ended"
    assert written.exists(), "the job's script never reached its end"
    seconds = now - float(written.read_text())
    (cwd / "exit_seconds").write_text(f"{seconds:.3f}\n")  # kept with the job, for a look later
    return seconds


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

    def has_bytes(self) -> bool:
        """Whether a client has sent anything (a request under way): peeked, never read."""
        for conn in list(self._held):
            try:
                if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    return True
            except (BlockingIOError, OSError):
                continue
        return False

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
