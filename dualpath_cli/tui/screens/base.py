"""What every cockpit screen has: the status line, the banner, the scrubber, the footer.

Why a base: the app hands each new :class:`~dualpath_cli.tui.source.Frame` to whatever
screen is showing, and a screen coming back into view renders the latest frame at once, so
switching screens never shows stale or empty data.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer

from dualpath_cli.tui.cockpit import Cockpit
from dualpath_cli.tui.source import Frame
from dualpath_cli.tui.widgets.bars import Banner, Scrubber, StatusBar

__all__ = ["CockpitScreen"]


class CockpitScreen(Screen[None]):
    """A screen of the cockpit; subclasses compose ``body()`` and render ``show_body``."""

    #: The screen's name in the footer and help (and its mode name).
    NAME = ""

    @property
    def top(self) -> Cockpit:
        """The app, as a screen may use it."""
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status", markup=False)
        yield Banner(id="banner", markup=False)
        yield Scrubber(id="scrubber", markup=False)
        yield from self.body()
        yield Footer()

    def body(self) -> ComposeResult:
        """The screen's own widgets."""
        yield from ()

    def on_mount(self) -> None:
        self.set_class(self.top.ascii_only, "ascii")
        if self.top.frame is not None:
            self.show(self.top.frame)

    def on_screen_resume(self) -> None:
        if self.top.frame is not None and self.is_mounted:
            self.show(self.top.frame)

    def show(self, frame: Frame) -> None:
        """Render ``frame``: the bars, then the body."""
        app = self.top
        self.query_one(StatusBar).show(frame, app.paused, app.interval_s, self.NAME)
        self.query_one(Banner).show(frame, app.interval_s)
        self.query_one(Scrubber).show(frame, app.ascii_only)
        self.show_body(frame)

    def show_body(self, frame: Frame) -> None:
        """Render the screen's own widgets."""
