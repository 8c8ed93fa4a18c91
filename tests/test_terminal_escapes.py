"""Escape sequences in a run's service name, run id, session tag, metric names and file name
never reach the terminal from any ``traintel`` command; the tables' own colours do.

A real job writes them (an OSC 52 that writes the clipboard, a screen clear, a window title,
a C1 CSI, a bell); every command reads the file, with colour forced as on a terminal.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.otlp_receiver import GrpcReceiver
from tests.subprocess_helpers import run_python
from traintel.cli import main

pytestmark = [pytest.mark.process, pytest.mark.server]

CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"
CLEAR = "\x1b[2J\x1b[H"
TITLE = "\x1b]0;owned\x1b\\"
C1_CSI = "\x9b31m"
CONCEAL = "\x1b[8m"  # a style code from the data (hides what follows) is data too: removed

JOB = f"""
import traintel
with traintel.application():
    with traintel.training_loop():
        for i in range(8):
            with traintel.training_iteration():
                traintel.record_metrics({{"loss{CLIPBOARD!r}": 1.0 / (i + 1), "lr": 0.1}})
print("trained")
""".replace("{CLIPBOARD!r}", "\\x1b]52;c;ZXZpbA==\\x07")

#: Anything that acts on a terminal but the style codes tables are drawn with.
_ACTING = re.compile(r"\x1b(?!\[[0-9;]*m)|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f-\x9f]")


def _hostile_run(tmp_path: Path) -> Path:
    runs = tmp_path / f"runs{CLEAR}"
    result = run_python(
        JOB,
        tmp_path,
        OTEL_SERVICE_NAME=f"svc{CLIPBOARD}{TITLE}{CONCEAL}",
        TRAINTEL_RUN_ID=f"run{C1_CSI}{CLEAR}",
        TRAINTEL_SESSION_TAG=f"tag\x07{TITLE}",
        TRAINTEL_OUTPUT_DIR=str(runs),
    )
    assert result.returncode == 0, result.stderr
    [file] = runs.glob("*.otlp.jsonl")
    with file.open("ab") as fh:  # an unreadable line: its reason names the file
        fh.write(b"not json\n")
    return runs


def test_no_command_writes_an_escape_sequence_from_its_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _hostile_run(tmp_path)
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich draws as on a terminal: its SGR codes stay
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.5")
    with GrpcReceiver() as closed:
        port = closed.port
    commands = [
        ["summary", str(runs)],
        ["runs", str(runs)],
        ["goodput", str(runs)],
        ["report", str(runs)],
        ["report", str(runs), "--json"],
        ["export-trace", str(runs), "-o", str(tmp_path / "trace.json")],
        ["replay", str(runs), "--endpoint", f"http://127.0.0.1:{port}", "--protocol", "grpc"],
    ]
    styled = 0
    for argv in commands:
        main(argv)
        out, err = capsys.readouterr()
        for text in (out, err):
            found = [text[m.start() : m.start() + 12] for m in _ACTING.finditer(text)]
            assert not found, (argv[0], found[:5], text[:2000])
        assert CONCEAL not in out + err
        styled += "\x1b[" in out
    assert styled, "the tables kept their colours"
    report = (tmp_path / "trace.json").read_text()
    assert "\\u001b" not in report and "\x1b" not in report, "the data carries no escape either"
