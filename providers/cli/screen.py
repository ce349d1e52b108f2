"""What the terminal shows: Markdown rendered with rich on a terminal (bold, code, aligned
tables with numbers on the right, lines wrapped between words), the text as it is elsewhere
(pipes and scripts get exactly what the agent wrote).

A reply that streams is redrawn as it grows (rich's ``Live``) and left on screen when done.
Only its last lines are redrawn: the lines above them are printed once, for good. A terminal
cannot move the cursor above its top row, so a redrawn region taller than the window is printed
again instead of replaced — a long answer appeared several times over, and once more when
Ctrl+C stopped it.

rich is imported only when a terminal is there to draw on.
"""

from __future__ import annotations

import os
import time
from typing import Any, TextIO

REFRESH_PER_SECOND = 8
MIN_LIVE_LINES = 3  # the redrawn tail of a streamed reply: the window's height less a margin


def wants_markdown(out: TextIO) -> bool:
    """Render for people: a terminal that is not 'dumb', unless NO_COLOR-style plain is asked."""
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and os.environ.get("TERM", "") != "dumb" and not os.environ.get("PLUTO_PLAIN")


class _Stream:
    """A reply being streamed: its text so far, and how many of its drawn lines are final."""

    def __init__(self, live: Any):
        self.live = live
        self.parts: list[str] = []
        self.printed = 0  # lines printed for good, above the live region
        self.drawn = 0.0  # when it was last drawn


class Screen:
    """Draws replies on ``out``: Markdown when ``markdown``, else the text as written."""

    def __init__(self, out: TextIO, *, markdown: bool, width: int | None = None,
                 console: Any = None, refresh_per_second: float = REFRESH_PER_SECOND):
        self.out = out
        self.markdown = markdown
        self._console: Any = console
        self._width = width
        self._interval = 1 / refresh_per_second if refresh_per_second > 0 else 0.0
        self._live: dict[str, _Stream] = {}  # run → its reply being streamed

    @property
    def console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.out, width=self._width, soft_wrap=False,
                                    highlight=False, emoji=False)
        return self._console

    def reply(self, text: str) -> None:
        """A whole reply."""
        if not self.markdown:
            self.out.write(text + "\n")
            return
        self.console.print(_markdown(text))

    def stream(self, run_id: str, piece: str) -> bool:
        """A piece of a reply being written; False when this screen does not redraw (the
        caller prints the piece itself)."""
        if not self.markdown:
            return False
        stream = self._live.get(run_id)
        if stream is None:
            from rich.live import Live

            stream = _Stream(Live(console=self.console, auto_refresh=False, transient=True,
                                  vertical_overflow="visible"))
            stream.live.start()
            self._live[run_id] = stream
        stream.parts.append(piece)
        now = time.monotonic()
        if now - stream.drawn >= self._interval:  # parse and draw at most this often: a long
            stream.drawn = now  # reply stays cheap
            self._draw(stream, final=False)
        return True

    def end(self, run_id: str) -> bool:
        """The streamed reply is complete: leave it drawn. False when nothing was streaming."""
        stream = self._live.pop(run_id, None)
        if stream is None:
            return False
        self._draw(stream, final=True)
        stream.live.stop()  # (transient: its region, empty now, goes)
        return True

    def _draw(self, stream: _Stream, *, final: bool) -> None:
        """Print the reply's lines that are above the redrawn tail for good (all of them when
        ``final``), and redraw the tail."""
        from rich.segment import Segment, Segments

        console = self.console
        lines = console.render_lines(_markdown("".join(stream.parts)),
                                     console.options.reset_height(),  # (else: cut to the window)
                                     pad=False)
        tail = 0 if final else max(MIN_LIVE_LINES, console.size.height - 2)
        settled = max(stream.printed, len(lines) - tail)
        if settled > stream.printed:
            stream.live.console.print(Segments(  # (Segments end with no line break)
                [*_joined(lines[stream.printed:settled], Segment), Segment.line()]))
            stream.printed = settled
        stream.live.update(Segments(_joined(lines[stream.printed:], Segment)), refresh=True)


def _joined(lines: list[list[Any]], segment: Any) -> list[Any]:
    """Rendered lines as one run of segments (a line break between lines, none after)."""
    out: list[Any] = []
    for i, line in enumerate(lines):
        if i:
            out.append(segment.line())
        out.extend(line)
    return out


def _markdown(text: str) -> Any:
    from rich.markdown import Markdown

    return Markdown(text, hyperlinks=False, code_theme="ansi_dark")
