"""Progress bars as lines when output goes to a pipe or a file (honcho, ``run``, a log file).

A progress bar (tqdm, or anything that redraws one line with ``\\r``) on a terminal
redraws in place. On a pipe, the ``\\r`` redraws never end a line: a reader that reads
lines (honcho, ``persia-launcher run``, ``tail -f`` of a log) sees nothing until the bar
closes, then every redraw at once, and a log line written meanwhile is glued to the bar.

:class:`ProgressLines` wraps such a stream so that a bar comes out as one line per
update, at most one every ``interval_s`` seconds (its first and its last state always),
and other text starts on a line of its own. :func:`progress_lines_when_piped` installs it
on ``sys.stdout`` and ``sys.stderr`` of an entry point when they are not terminals.
Text without ``\\r`` passes through unchanged.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Iterable
from typing import IO, Any

from pyrsia.shared.constants import PROGRESS_LINE_INTERVAL_S

_TOKENS = re.compile(r"(\r\n|\r|\n)")


class ProgressLines:
    """A text stream that writes ``\\r`` redraws to ``stream`` as (rate-limited) lines.

    Every other attribute (``fileno``, ``encoding``, ``buffer``, ``isatty`` ...) is the
    wrapped stream's.
    """

    def __init__(self, stream: IO[str], interval_s: float = PROGRESS_LINE_INTERVAL_S) -> None:
        self._stream = stream
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._after_cr = False  # the last token was a "\r": the next text is a redraw
        self._in_bar = False  # the current line is a bar's (its state may be held back)
        self._held: str | None = None  # the bar's latest state, not yet written
        self._mid_line = False  # plain text written without its newline yet
        self._last_line_at = 0.0

    @property
    def wrapped(self) -> IO[str]:
        """The stream written to."""
        return self._stream

    def write(self, text: str) -> int:
        with self._lock:
            out: list[str] = []
            self._after_cr = False  # a "\r" ending the last write (a bar cleared) moved nothing
            for token in _TOKENS.split(text):
                if token:
                    self._token(token, out)
            if out:
                self._stream.write("".join(out))
        return len(text)

    def _token(self, token: str, out: list[str]) -> None:
        if token == "\r":
            self._after_cr = True
        elif token in ("\n", "\r\n"):
            if self._in_bar:  # the bar ends: its last state, once
                self._release(out)
            else:
                out.append("\n")
                self._mid_line = False
            self._after_cr = False
        elif self._after_cr:
            self._redraw(token, out)
            self._after_cr = False
        else:
            if self._in_bar:  # text after a bar starts a line of its own
                self._release(out)
            out.append(token)
            self._mid_line = True

    def _redraw(self, text: str, out: list[str]) -> None:
        state = text.rstrip()
        if not state:  # a bar cleared (tqdm's leave=False): nothing to show
            self._held, self._in_bar = None, False
            return
        if self._mid_line:
            out.append("\n")
            self._mid_line = False
        now = time.monotonic()
        first = not self._in_bar
        self._in_bar = True
        if first or now - self._last_line_at >= self._interval_s:
            out.append(state + "\n")
            self._held, self._last_line_at = None, now
        else:
            self._held = state

    def _release(self, out: list[str]) -> None:
        if self._held is not None:
            out.append(self._held + "\n")
            self._last_line_at = time.monotonic()
        self._held, self._in_bar = None, False

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def progress_lines_when_piped(interval_s: float = PROGRESS_LINE_INTERVAL_S) -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in :class:`ProgressLines` where they are not
    terminals (once), and point the logging handlers that wrote to them at the wrappers,
    so that log lines and bars share one line discipline."""
    swapped: dict[int, ProgressLines] = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, ProgressLines):
            continue
        try:
            if stream.isatty():
                continue
        except (AttributeError, ValueError):  # a closed or odd stream: leave it
            continue
        wrapper = ProgressLines(stream, interval_s)
        swapped[id(stream)] = wrapper
        setattr(sys, name, wrapper)
    if not swapped:
        return
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in swapped:
                handler.setStream(swapped[id(handler.stream)])
