"""One status line on stderr, redrawn in place on a terminal by Rich, written once into a log.

Every long command's progress (hashing, bench, transcription) is such a line: its owner decides
what the line says and how often it changes; this draws it. On a terminal Rich's Live redraws the
line, cropped to the terminal's width (a wrapped line could not be redrawn in place) and erased
before the next; anywhere else (a log, a pipe) only the line a command finishes with is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.live import Live
    from rich.text import Text


class LiveLine:
    """`draw` redraws on a terminal only; `finish`, `abandon` and `clear` end the line."""

    def __init__(self, stream: TextIO) -> None:
        # Imported here: only the commands that show progress pay for Rich's import.
        from rich.console import Console

        self._stream = stream
        # The stream says whether it is a terminal, not FORCE_COLOR and friends: a log never
        # gets redraws.
        self.interactive = bool(getattr(stream, "isatty", lambda: False)())
        self._console = Console(
            file=stream,
            force_terminal=self.interactive,
            highlight=False,
            markup=False,
            emoji=False,
        )
        self._live: Live | None = None

    @property
    def drawn(self) -> bool:
        return self._live is not None

    def draw(self, line: str) -> None:
        if not self.interactive:
            return
        if self._live is None:
            from rich.live import Live

            # Refreshed when we say (the owner paces it), drawn on our stream only: stdout, where
            # results go, is left alone.
            self._live = Live(
                self._text(line),
                console=self._console,
                auto_refresh=False,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start(refresh=True)
        else:
            self._live.update(self._text(line), refresh=True)

    def finish(self, line: str) -> None:
        """`line` stays: the last frame on a terminal, the one line written into a log."""
        if self._live is None:  # a log, or a terminal nothing was drawn on yet
            self._stream.write(line + "\n")
            self._stream.flush()
            return
        self._live.update(self._text(line))  # drawn by the last refresh, as the Live stops
        self._stop(keep=True)

    def abandon(self) -> None:
        """End the line where it is, so that what is printed next (an error) goes under it."""
        self._stop(keep=True)

    def clear(self) -> None:
        """Erase the line: nothing is left of it."""
        self._stop(keep=False)

    def _stop(self, *, keep: bool) -> None:
        if self._live is None:
            return
        self._live.transient = not keep
        self._live.stop()
        self._live = None

    @staticmethod
    def _text(line: str) -> Text:
        from rich.text import Text

        return Text(line, no_wrap=True, overflow="crop", end="")
