"""Troubleshooting workflows (the seed's section 6) as pure rules over views and decisions.

``model`` holds the findings and the evidence bundle, ``rules`` the workflows and their
thresholds (documented in docs/troubleshooting.md). Nothing here talks to a cluster: the CLI
collects samples live or from a recording and hands them over.
"""

from __future__ import annotations

from dualpath_cli.diagnose.model import Evidence, Finding, Report, Severity

__all__ = ["Evidence", "Finding", "Report", "Severity"]
