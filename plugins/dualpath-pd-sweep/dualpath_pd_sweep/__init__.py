"""dualpath-pd-sweep: which xPyD splits of a node budget are bottleneck-free.

``SweepRow`` and ``sweep_pd`` are loaded on first use (PEP 562): the entry point
(``dualpath_pd_sweep.plugin``) is imported by every ``dualpath --help``, which must not pay
for the sweep and the core's capacity model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dualpath_pd_sweep.sweep import SweepRow, sweep_pd

__version__ = "0.1.0"
__all__ = ["SweepRow", "sweep_pd", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("SweepRow", "sweep_pd"):
        from dualpath_pd_sweep import sweep

        return getattr(sweep, name)
    raise AttributeError(f"module 'dualpath_pd_sweep' has no attribute {name!r}")
