"""What the ``traintel`` command writes to a terminal carries no control sequence from its input.

Why: telemetry files are input from whoever could write them, and the commands print what is
in them (service names, run ids, metric names, file names, error messages). A terminal obeys
escape sequences: an OSC 52 in a service name wrote the reader's clipboard, others set the
window title, move the cursor over earlier lines or clear the screen. Two places, because a
terminal cannot be told traintel's own styling from the data's:

- the reader gives the commands every string with its control characters replaced by U+FFFD
  (:func:`displayable_line`, on the raw line, before decoding: a line without any costs one
  search), so no data carries an escape sequence into a table, a JSON report or an HTML page;
- the command's ``stdout`` and ``stderr`` go through :class:`SafeStream`, which passes the
  colour and style codes the tables are drawn with (SGR, ``ESC [ ... m``) and removes every
  other control sequence and character but newline and tab: whatever reaches the output
  another way (a file name, an error message) cannot act on the terminal.
"""

from __future__ import annotations

import re
from typing import Any, TextIO

_SGR = re.compile(r"\x1b\[[0-9;]*m")
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: cursor moves, erasing, modes (SGR kept, see strip_controls)
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC (title, clipboard, hyperlinks) to BEL or ST
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -~]?"  # any other escape, and a lone ESC
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # C0 but tab and newline, DEL, C1 (CSI is also U+009B)
)


def _keep_style(match: re.Match[str]) -> str:
    return match.group() if _SGR.fullmatch(match.group()) else ""


def strip_controls(text: str) -> str:
    """``text`` without control sequences or characters, style codes (SGR) and newline and tab
    kept."""
    return _CONTROL.sub(_keep_style, text)


class SafeStream:
    """A text stream writing through :func:`strip_controls`; everything else is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        # and a lone surrogate (a file name os.fsdecode made, quoted in a message) as U+FFFD: the
        # terminal's encoding would refuse it, and the command die on a print
        self.stream.write(_SURROGATE.sub("\ufffd", strip_controls(text)))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, flush, encoding, ...
        return getattr(self.stream, name)


#: C0 escapes but tab and newline, DEL and C1, as JSON writes them (an odd number of backslashes
#: before the ``u``: ``\\u001b`` is a backslash and text), and DEL and C1 written raw (UTF-8).
_JSON_CONTROL = re.compile(
    rb"(?<!\\)((?:\\\\)*)\\u00(?:0[0-8bBcCdDeEfF]|1[0-9a-fA-F]|7[fF]|[89][0-9a-fA-F])|\x7f|\xc2[\x80-\x9f]"
)
_REPLACEMENT = "\ufffd".encode()


def _replace(match: re.Match[bytes]) -> bytes:
    escaped = match.group(1)
    return escaped + b"\\ufffd" if escaped is not None else _REPLACEMENT


def displayable_line(line: bytes) -> bytes:
    """An OTLP/JSON line with every control character in its strings (but tab and newline)
    replaced by U+FFFD, still the same JSON otherwise."""
    if b"\\" not in line and b"\x7f" not in line and line.isascii():
        return line  # (each a one-byte scan: 10x faster than looking for the two bytes "\\u")
    if b"\\u" not in line and b"\x7f" not in line and b"\xc2" not in line:
        return line
    return _JSON_CONTROL.sub(_replace, line)
