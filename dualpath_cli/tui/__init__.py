"""``dualpath top``: a Textual live cockpit over a cluster's API or a recording.

A front-end only: data comes through :mod:`dualpath_cli.tui.source` (the API client, live,
or a recording read by services/recording.py), findings from diagnose/rules.py, changes
through the client's PATCH. Nothing here imports the runtime. ``app`` imports Textual, so
import it only where the cockpit runs (the CLI keeps ``--help`` free of Textual).
"""

from __future__ import annotations

__all__: list[str] = []
