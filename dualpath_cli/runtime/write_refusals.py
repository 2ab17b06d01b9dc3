"""Block writes a node's store refused: counted by reason, logged without a flood.

Why apart from the engine's context: a full store refuses every block every turn would
write (745 lines for 62 blocks, issue 34), so the count goes to
``dualpath_storage_write_errors_total{node,role,reason}`` (what diagnose's store-health
workflow reads) and the log says the first refusal of each reason at once, then at most one
line every :data:`LOG_EVERY_S` with how many were refused since.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dualpath_cli.storage.errors import WRITE_REFUSALS, write_refusal_of
from dualpath_cli.telemetry.registry import Counter, MetricsRegistry

__all__ = ["WriteRefusals", "LOG_EVERY_S"]

log = logging.getLogger(__name__)

#: Least seconds between two log lines about refused writes of one reason.
LOG_EVERY_S = 10.0


class WriteRefusals:
    """The refused writes of one engine, by reason (:data:`WRITE_REFUSALS`)."""

    def __init__(self, registry: MetricsRegistry, node: int | str, role: str, engine: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.clock = clock
        self.counters: dict[str, Counter] = {
            why: registry.counter("dualpath_storage_write_errors_total", node=node, role=role,
                                  reason=why) for why in WRITE_REFUSALS}
        self._lock = threading.Lock()
        self._last_log: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def count(self, key_hex: str, err: BaseException) -> str:
        """One refused write of block ``key_hex``: counted, and logged unless a line about
        this reason was written less than :data:`LOG_EVERY_S` ago. Returns its reason."""
        why = write_refusal_of(err)
        self.counters[why].inc()
        now = self.clock()
        with self._lock:
            last = self._last_log.get(why)
            if last is not None and now - last < LOG_EVERY_S:
                self._unlogged[why] = self._unlogged.get(why, 0) + 1
                return why
            since = self._unlogged.pop(why, 0)
            self._last_log[why] = now
        more = f" ({since} more refused since the last line)" if since else ""
        log.warning("engine %d: could not persist block %s: %s%s", self.engine, key_hex, err,
                    more)
        return why
