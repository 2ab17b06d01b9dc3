"""The cockpit's own widgets: status line, banner, replay scrubber, NIC quadrant."""

from __future__ import annotations

from dualpath_cli.tui.widgets.bars import Banner, Scrubber, StatusBar
from dualpath_cli.tui.widgets.quadrant import QuadrantView

__all__ = ["Banner", "Scrubber", "StatusBar", "QuadrantView"]
