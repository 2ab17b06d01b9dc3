"""The cockpit's screens (one per view of the cluster) and its dialogs."""

from __future__ import annotations

__all__: list[str] = []
