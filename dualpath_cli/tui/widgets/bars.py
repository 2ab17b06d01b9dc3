"""One-line bars every screen carries: the status line, the cluster-gone banner, the
replay scrubber.

Why widgets of their own: each screen composes them, and the app updates them from one
:class:`~dualpath_cli.tui.source.Frame` wherever the operator is.
"""

from __future__ import annotations

from textual.widgets import Static

from dualpath_cli.tui.format import alert_counts, clock, status_line
from dualpath_cli.tui.source import Frame, ReplayPos

__all__ = ["StatusBar", "Banner", "Scrubber", "scrubber_text"]


class StatusBar(Static):
    """Shape, state, time, thresholds, refresh and the alert count (worst first)."""

    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $text; text-wrap: nowrap;
                text-overflow: ellipsis; }
    """

    def show(self, frame: Frame, paused: bool, interval_s: float, screen: str = "") -> None:
        """Render ``frame``'s status (``screen``: the screen's name)."""
        counts = alert_counts(frame.reports)
        alerts = " ".join(f"{counts[k]} {k}" for k in ("CRITICAL", "WARNING") if counts.get(k))
        extra = alerts if alerts else "no alerts"
        self.update(status_line(frame.view, frame.source, paused, interval_s, extra, screen))


class Banner(Static):
    """Shown while the cluster does not answer: why, since when, and that it retries."""

    DEFAULT_CSS = """
    Banner { height: auto; background: $error; color: $text; display: none;
             padding: 0 1; }
    Banner.-shown { display: block; }
    """

    def show(self, frame: Frame, interval_s: float) -> None:
        """Show the banner when ``frame`` carries an error, hide it otherwise."""
        if frame.error is None:
            self.set_class(False, "-shown")
            return
        since = (f"showing data from {clock(frame.view.at)} UTC; " if frame.view is not None
                 else "no data yet; ")
        self.update(f"CLUSTER UNREACHABLE: {frame.error} -- {since}reconnecting every "
                    f"{interval_s:g} s (r: now)")
        self.set_class(True, "-shown")


def scrubber_text(pos: ReplayPos, width: int, ascii_only: bool) -> str:
    """``replay 03:00:12 [=====|-----] 120/600 x4 playing`` fitted to ``width``."""
    at = pos.start_at + (pos.end_at - pos.start_at) * (pos.index / max(1, pos.total - 1))
    head = f"replay {clock(at)} UTC"
    tail = (f"{pos.index + 1}/{pos.total} x{pos.speed:g} "
            f"{'playing' if pos.playing else 'stopped'}")
    keys = ("  space play  </> step  [/] jump  +/- speed" if ascii_only else
            "  space play  ←/→ step  [/] jump  +/- speed")
    room = width - len(head) - len(tail) - 4
    if room - len(keys) >= 10:
        room -= len(keys)
    else:
        keys = ""
    bar = " "
    if room >= 5:
        filled = int(round(room * (pos.index + 1) / pos.total))
        a, b = ("=", "-") if ascii_only else ("█", "░")
        bar = " [" + a * filled + b * (room - filled) + "] "
    return f"{head}{bar}{tail}{keys}"


class Scrubber(Static):
    """The replay's time scrubber (hidden when live)."""

    DEFAULT_CSS = """
    Scrubber { height: 1; background: $boost; display: none; text-wrap: nowrap; }
    Scrubber.-shown { display: block; }
    """

    def show(self, frame: Frame, ascii_only: bool) -> None:
        """Render the replay position, or hide when live."""
        if frame.replay is None:
            self.set_class(False, "-shown")
            return
        self.set_class(True, "-shown")
        width = self.size.width or self.app.size.width
        self.update(scrubber_text(frame.replay, width, ascii_only))
