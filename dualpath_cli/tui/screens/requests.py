"""The requests screen: the turns in flight (PE, DE, read side or split, KV bytes read, TTFT so
far), oldest first; the highlighted one's story below, as ``dualpath explain`` tells it
(diagnose/explain.py: arrival, PE and DE with their classes and the thresholds, the read
side and why, blocks hit and missed, bytes per NIC, per-layer slack, the TTFT breakdown;
what is known so far while it runs), then the decision-log entry that placed it.

``l`` switches the list to the recent decisions (an idle cluster's last turns) and back. A
source without an in-flight listing (an older server or recording) shows the decisions.
The screen only lays out what the source serves: the listing is the API's (``GET
/api/v1/requests?state=inflight``) and the story is fetched through the source in a worker
thread, so a slow answer never blocks keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker

from dualpath_cli.diagnose.explain import render_story
from dualpath_cli.errors import DualPathError
from dualpath_cli.telemetry.stories import InflightTurn, RequestStory
from dualpath_cli.telemetry.view import NA, Decision
from dualpath_cli.tui.format import DECISION_COLUMNS, decision_detail, decision_rows
from dualpath_cli.tui.screens.base import CockpitScreen
from dualpath_cli.tui.source import Frame
from dualpath_cli.units import format_bytes, format_duration

__all__ = ["RequestsScreen", "INFLIGHT_COLUMNS", "inflight_cells", "story_text"]

#: Headers of the in-flight list (matching :func:`inflight_cells`).
INFLIGHT_COLUMNS = ("req", "agent/turn", "phase", "age", "PE", "DE", "read", "KV read",
                    "TTFT", "PE cls", "DE cls")

_SIDES = {"pe": "PE", "de": "DE", "none": "none"}


def _opt(value: Any) -> str:
    return NA if value is None else str(value)


def inflight_cells(row: InflightTurn) -> tuple[str, ...]:
    """One in-flight row (the API's) as table cells: the read side with its split in
    tokens, KV bytes read of those to read (``loading`` while the engines have not
    reported), and the TTFT once known, else ``>`` the time waited so far."""
    side = row.side
    if side == "split":
        read = f"split {row.pe_tokens}/{row.de_tokens}"
    else:
        read = _SIDES.get(side, NA) if side is not None else NA
    done = row.bytes_read
    kv = (f"{'loading' if done is None else format_bytes(done)}/"
          f"{format_bytes(row.bytes_to_read or 0)}")
    if row.ttft_s is not None:
        ttft = format_duration(row.ttft_s)
    else:
        ttft = f">{format_duration(row.waited_s or 0.0)}"
    rid = str(row.rid) + (f" (try {row.attempt + 1})" if row.attempt else "")
    return (rid, f"{row.agent}/{row.turn}", str(row.phase),
            format_duration(row.age_s or 0.0), _opt(row.pe), _opt(row.de), read, kv, ttft,
            _opt(row.pe_class), _opt(row.de_class))


def story_text(story: RequestStory, decisions: Sequence[Decision]) -> str:
    """The story's lines, then the decision-log entry that placed the request (its newest
    kept decision, with its inputs) when the frame's window still holds it."""
    lines = render_story(story)
    rid = story.rid
    mine = [d for d in decisions if d.rid == rid and d.kind == "turn"]
    if mine:
        lines.insert(1, f"  placed by decision #{mine[-1].seq} (its entry below)")
        lines += ["", "the decision that placed it:", decision_detail(mine[-1])]
    return "\n".join(lines)


class RequestsScreen(CockpitScreen):
    """In-flight turns (or recent decisions) over the selected request's story."""

    NAME = "requests"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("l", "toggle_list", "In flight/decisions", show=False),
    ]
    DEFAULT_CSS = """
    RequestsScreen #req-title { height: 1; }
    RequestsScreen #requests { height: 1fr; }
    RequestsScreen #detail-box { height: 1fr; border-top: solid $primary; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.selected: int | None = None  # the request (rid) whose story is shown
        self.decisions_view = False  # ``l``: list the recent decisions instead
        self._mode = ""  # the columns the table has now
        self._keys: dict[str, int] = {}  # row key -> rid

    def body(self) -> ComposeResult:
        yield Static("", id="req-title", markup=False)
        yield DataTable(id="requests", cursor_type="row")
        with VerticalScroll(id="detail-box"):
            yield Static("no request selected (up/down, enter)", id="detail", markup=False)

    def _columns(self, mode: str) -> DataTable[str]:
        table: DataTable[str] = self.query_one("#requests", DataTable)
        if mode != self._mode:
            table.clear(columns=True)
            for name in INFLIGHT_COLUMNS if mode == "inflight" else DECISION_COLUMNS:
                table.add_column(name, key=name)
            self._mode = mode
        else:
            table.clear()
        return table

    def show_body(self, frame: Frame) -> None:
        listing = frame.inflight
        title = self.query_one("#req-title", Static)
        if listing is None or self.decisions_view:
            table = self._columns("decisions")
            at = frame.view.at if frame.view is not None else None
            rows = decision_rows(frame.decisions, at)
            rid_of = {d.seq: d.rid for d in frame.decisions}
            keys = [(str(seq), rid_of[seq], cells) for seq, cells in rows]
            why = ("this source serves no in-flight list (an older server or recording)"
                   if listing is None else "l: the turns in flight")
            title.update(f"recent decisions, newest first ({why})")
        else:
            table = self._columns("inflight")
            reqs = listing.turns
            keys = [(str(r.rid), int(r.rid), inflight_cells(r)) for r in reqs]
            total = listing.total if listing.total is not None else len(reqs)
            shown = f" (the oldest {len(reqs)} shown)" if total > len(reqs) else ""
            title.update(f"{total} turn{'s' if total != 1 else ''} in flight{shown}, oldest "
                         "first; l: recent decisions")
        self._keys = {key: rid for key, rid, _ in keys}
        where = None
        for i, (key, rid, cells) in enumerate(keys):
            table.add_row(*cells, key=key)
            if where is None and rid == self.selected:
                where = i
        if keys:
            table.move_cursor(row=where or 0, animate=False)
        if self.selected is None and not keys:
            self.query_one("#detail", Static).update(
                "no turn in flight (l: recent decisions)" if self._mode == "inflight"
                else "no decisions logged yet")
        if self.selected is not None:
            self._story(self.selected)

    def action_toggle_list(self) -> None:
        """Switch the list between the turns in flight and the recent decisions."""
        self.decisions_view = not self.decisions_view
        if self.top.frame is not None:
            self.show_body(self.top.frame)

    @work(thread=True, exclusive=True, group="story", exit_on_error=False)
    def _fetch(self, rid: int) -> None:
        """Ask the source for ``rid``'s story (blocking I/O: off the UI thread)."""
        text = self._text(rid)
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._show_story, rid, text)

    def _show_story(self, rid: int, text: str) -> None:
        if rid == self.selected and self.is_mounted:
            self.query_one("#detail", Static).update(text)

    @on(DataTable.RowHighlighted, "#requests")
    @on(DataTable.RowSelected, "#requests")
    def _pick(self, event: DataTable.RowHighlighted | DataTable.RowSelected) -> None:
        key = event.row_key.value
        rid = self._keys.get(key) if key is not None else None
        if rid is None or (rid == self.selected and isinstance(event, DataTable.RowHighlighted)):
            return
        self.selected = rid
        self._story(rid)

    def _story(self, rid: int) -> None:
        """Show ``rid``'s story: a recording's at once (no I/O: a replay step shows the
        story of that step), a live cluster's from a worker thread."""
        if self.top.replay is not None:
            self._show_story(rid, self._text(rid))
        else:
            self._fetch(rid)

    def _text(self, rid: int) -> str:
        frame = self.top.frame
        try:
            story = self.top.source.story(rid)
        except DualPathError as err:
            return f"request {rid}: {err}"
        return story_text(story, frame.decisions if frame is not None else ())
