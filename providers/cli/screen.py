"""What the terminal shows: Markdown rendered with rich on a terminal (bold, code, aligned
tables with numbers on the right, lines wrapped between words), the text as it is elsewhere
(pipes and scripts get exactly what the agent wrote).

A reply that streams is redrawn as it grows (rich's ``Live``) and left on screen when done.
rich is imported only when a terminal is there to draw on.
"""

from __future__ import annotations

import os
import time
from typing import Any, TextIO

REFRESH_PER_SECOND = 8


def wants_markdown(out: TextIO) -> bool:
    """Render for people: a terminal that is not 'dumb', unless NO_COLOR-style plain is asked."""
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and os.environ.get("TERM", "") != "dumb" and not os.environ.get("PLUTO_PLAIN")


class Screen:
    """Draws replies on ``out``: Markdown when ``markdown``, else the text as written."""

    def __init__(self, out: TextIO, *, markdown: bool, width: int | None = None):
        self.out = out
        self.markdown = markdown
        self._console: Any = None
        self._width = width
        self._live: dict[str, tuple[Any, list[str]]] = {}  # run → (Live, its text so far)
        self._drawn: dict[str, float] = {}  # run → when it was last drawn

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
        live = self._live.get(run_id)
        if live is None:
            from rich.live import Live

            live = (Live(console=self.console, vertical_overflow="visible",
                         auto_refresh=False), [])
            live[0].start()
            self._live[run_id] = live
        live[1].append(piece)
        now = time.monotonic()
        if now - self._drawn.get(run_id, 0.0) >= 1 / REFRESH_PER_SECOND:  # parse and draw
            self._drawn[run_id] = now  # at most this often: a long reply stays cheap
            live[0].update(_markdown("".join(live[1])), refresh=True)
        return True

    def end(self, run_id: str) -> bool:
        """The streamed reply is complete: leave it drawn. False when nothing was streaming."""
        live = self._live.pop(run_id, None)
        self._drawn.pop(run_id, None)
        if live is None:
            return False
        live[0].update(_markdown("".join(live[1])))
        live[0].stop()
        return True


def _markdown(text: str) -> Any:
    from rich.markdown import Markdown

    return Markdown(text, hyperlinks=False, code_theme="ansi_dark")
