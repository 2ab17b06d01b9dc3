"""The attempts an engine dropped, so late messages of them are dropped too.

Why: a turn's attempt is cancelled when its other engine dies or a read fails, and the
scheduler runs the next attempt, maybe on the same engine. Messages from the peer engine
(a DE's Layers to a PE, a PE's Layers to a DE) travel on another socket than the
scheduler's, so the old attempt's last ones can land after its cancel or even after the
next attempt's dispatch. Taken as new, they would replace the live attempt's job (the turn
never finishes) or sit buffered with their KV bytes forever.
"""

from __future__ import annotations

import collections

__all__ = ["EndedAttempts", "ENDED_KEPT"]

#: Cancelled attempts remembered per engine: a peer's last messages land within moments of
#: the cancel, so a few thousand requests cover any burst of re-queues.
ENDED_KEPT = 4096


class EndedAttempts:
    """Per request, the newest attempt this engine cancelled (the oldest forgotten first)."""

    def __init__(self, kept: int = ENDED_KEPT) -> None:
        self.kept = kept
        self._last: collections.OrderedDict[int, int] = collections.OrderedDict()

    def end(self, rid: int, att: int) -> None:
        """Attempt ``att`` of ``rid`` is over here: its late messages are stale."""
        self._last[rid] = max(att, self._last.get(rid, -1))
        self._last.move_to_end(rid)
        while len(self._last) > self.kept:
            self._last.popitem(last=False)

    def cancel(self, rid: int, att: int, holding: int = -1) -> bool:
        """A cancel of attempt ``att`` of ``rid`` (-1: whatever attempt is held) came while
        this engine holds attempt ``holding`` (-1: none). Returns whether the held job is
        the one cancelled (the caller drops it); a newer attempt's job is kept. The
        cancelled attempt is remembered even when none is held: a message of it can come
        after the cancel on another path (the Decode a PE forwards)."""
        if holding >= 0 and 0 <= att < holding:
            self.end(rid, att)
            return False
        if holding >= 0 or att >= 0:
            self.end(rid, max(att, holding))
        return holding >= 0

    def stale(self, rid: int, att: int, holding: int = -1) -> bool:
        """Whether a message of attempt ``att`` of ``rid`` is late: of an attempt cancelled
        here, or older than ``holding``, the attempt of the job this engine holds for
        ``rid`` (-1: none)."""
        return att <= self._last.get(rid, -1) or att < holding

    def __len__(self) -> int:
        return len(self._last)

    def __contains__(self, rid: object) -> bool:
        return rid in self._last
