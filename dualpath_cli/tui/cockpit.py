"""What a screen may ask of the cockpit app: the latest frame, the source, the settings.

Why a Protocol here: the app (tui/app.py) imports every screen to register them; the
screens need a few of its attributes back. Typed against this small interface, the screens
never import the app, so the import graph stays one-way (app -> screens -> cockpit).
"""

from __future__ import annotations

from typing import Protocol

from dualpath_cli.telemetry.view import AuditEntry
from dualpath_cli.tui.source import Frame, Predictor, ReplaySource, Source

__all__ = ["Cockpit"]


class Cockpit(Protocol):
    """The app as the screens see it (:class:`~dualpath_cli.tui.app.TopApp` is one)."""

    source: Source
    interval_s: float
    ascii_only: bool
    predictor: Predictor | None
    frame: Frame | None
    paused: bool

    @property
    def replay(self) -> ReplaySource | None:
        """The replay source, when replaying."""
        ...

    def request_poll(self) -> None:
        """Poll now (or right after the poll in progress)."""
        ...

    def note_audit(self, entry: AuditEntry) -> None:
        """Show an accepted change in the audit trail before the next poll."""
        ...
