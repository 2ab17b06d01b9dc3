"""dualpath-pd-sweep: which xPyD splits of a node budget are bottleneck-free."""

from __future__ import annotations

from dualpath_pd_sweep.sweep import SweepRow, sweep_pd

__version__ = "0.1.0"
__all__ = ["SweepRow", "sweep_pd", "__version__"]
