"""The cockpit app: screens as modes, one poll loop, replay keys, pause, interval, theme.

Why one poll loop in a worker thread: a poll is blocking I/O (the API client) and the rules
over the window; the UI thread only renders the resulting
:class:`~dualpath_cli.tui.source.Frame`, so a slow or vanished cluster never freezes keys.
Only one poll runs at a time; a tick that finds one still running is skipped.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.timer import Timer

from dualpath_cli.telemetry.view import AuditEntry
from dualpath_cli.tui.screens.alerts import AlertsScreen
from dualpath_cli.tui.screens.base import CockpitScreen
from dualpath_cli.tui.screens.cluster import ClusterScreen
from dualpath_cli.tui.screens.dialogs import HelpScreen, TuneScreen
from dualpath_cli.tui.screens.layers import LayersScreen
from dualpath_cli.tui.screens.nic import NicScreen
from dualpath_cli.tui.screens.requests import RequestsScreen
from dualpath_cli.tui.source import Frame, Predictor, ReplaySource, Source

__all__ = ["TopApp", "INTERVALS", "SPEEDS", "SCREENS_BY_KEY"]

#: What ``i`` cycles through (seconds).
INTERVALS = (0.5, 1.0, 2.0, 5.0)
#: Replay speeds ``+``/``-`` step through.
SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: Digit key -> mode name.
SCREENS_BY_KEY = {"1": "cluster", "2": "nic", "3": "layers", "4": "requests", "5": "alerts"}
_SCREENS = Binding.Group("screens", compact=True)
_REPLAY_ACTIONS = {"play", "step", "jump", "seek", "speed"}


class TopApp(App[None]):
    """``dualpath top``.

    Args:
        source: a :class:`~dualpath_cli.tui.source.LiveSource` or ``ReplaySource``.
        interval_s: seconds between polls (live) and the replay's base tick.
        ascii_only: ASCII borders, bars and sparklines (``--ascii``).
        theme: ``dark`` or ``light``.
        predictor: the predicted-effect function the CLI hands over (the tuning twin's).
        start: the mode to open (``cluster``, ``nic``, ...).
    """

    TITLE = "dualpath top"
    ENABLE_COMMAND_PALETTE = False
    #: ``--ascii``: every screen and dialog carries the ``ascii`` class (App CSS is not
    #: scoped to one widget, so these rules reach into the screens).
    CSS = """
    .ascii StatusBar, .ascii Scrubber { text-overflow: clip; }
    .ascii QuadrantView { border: ascii $primary; }
    .ascii #detail-box, .ascii #finding-box { border-top: ascii $primary; }
    HelpScreen.ascii > VerticalScroll, TuneScreen.ascii > Vertical { border: ascii $primary; }
    ConfirmScreen.ascii > Vertical { border: ascii $warning; }
    .ascii DataTable, .ascii VerticalScroll { scrollbar-size: 0 0; }
    .ascii Input { border: ascii $primary; }
    .ascii Button { border: none; height: 1; margin: 0 1; }
    """
    MODES: ClassVar[dict[str, type[CockpitScreen]]] = {  # type: ignore[assignment]
        "cluster": ClusterScreen, "nic": NicScreen, "layers": LayersScreen,
        "requests": RequestsScreen, "alerts": AlertsScreen}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        *(Binding(key, f"show('{mode}')", mode.capitalize(), group=_SCREENS)
          for key, mode in SCREENS_BY_KEY.items()),
        Binding("t", "tune", "Tune"),
        Binding("p", "pause", "Pause"),
        Binding("i", "interval", "Interval", show=False),
        Binding("d", "toggle_theme", "Dark/light", show=False),
        Binding("r", "reconnect", "Reconnect", show=False),
        Binding("space", "play", "Play", show=False, priority=True),
        Binding("left", "step(-1)", "Back", show=False, priority=True),
        Binding("right", "step(1)", "Forward", show=False, priority=True),
        Binding("left_square_bracket", "jump(-0.1)", "Jump back", show=False),
        Binding("right_square_bracket", "jump(0.1)", "Jump ahead", show=False),
        Binding("home", "seek(0)", "First", show=False, priority=True),
        Binding("end", "seek(-1)", "Last", show=False, priority=True),
        Binding("plus,equals_sign", "speed(1)", "Faster", show=False),
        Binding("minus", "speed(-1)", "Slower", show=False),
    ]

    def __init__(self, source: Source, *, interval_s: float = 1.0, ascii_only: bool = False,
                 theme: str = "dark", predictor: Predictor | None = None,
                 start: str = "cluster") -> None:
        super().__init__()
        self.source = source
        self.interval_s = interval_s
        self.ascii_only = ascii_only
        self.predictor = predictor
        self.frame: Frame | None = None
        self.frames = 0
        self.paused = False
        self._start = start if start in self.MODES else "cluster"
        self._theme_name = "textual-light" if theme == "light" else "textual-dark"
        self._poll_timer: Timer | None = None
        self._play_timer: Timer | None = None
        self._polling = False
        self._again = False

    # -- life cycle -------------------------------------------------------------------------
    def on_mount(self) -> None:
        self.theme = self._theme_name
        self.switch_mode(self._start)
        self.request_poll()
        self._poll_timer = self.set_interval(self.interval_s, self._tick)

    def on_unmount(self) -> None:
        self.source.close()

    @property
    def replay(self) -> ReplaySource | None:
        """The replay source, when replaying."""
        return self.source if isinstance(self.source, ReplaySource) else None

    # -- polling ----------------------------------------------------------------------------
    def _tick(self) -> None:
        if not self.paused and self.replay is None:
            self.request_poll()

    def request_poll(self) -> None:
        """Poll now (or right after the poll in progress)."""
        if self._polling:
            self._again = True
            return
        self._polling = True
        self._poll()

    @work(thread=True, exclusive=False, group="poll", exit_on_error=False)
    def _poll(self) -> None:
        try:
            frame = self.source.poll()
        except Exception as err:  # noqa: BLE001 - a poll must never take the cockpit down
            frame = Frame(self.frame.view if self.frame else None,
                          self.frame.history if self.frame else (),
                          error=f"{type(err).__name__}: {err}", source=self.source.label)
        self.call_from_thread(self._apply, frame)

    def _apply(self, frame: Frame) -> None:
        self._polling = False
        self.frame = frame
        self.frames += 1
        screen = self.screen
        if isinstance(screen, CockpitScreen) and screen.is_mounted:
            screen.show(frame)
        elif self.screen_stack:
            under = next((s for s in reversed(self.screen_stack)
                          if isinstance(s, CockpitScreen)), None)
            if under is not None and under.is_mounted:
                under.show(frame)
        if self._again:
            self._again = False
            self.request_poll()

    def rerender(self) -> None:
        """Render the last frame again (after a setting changed)."""
        if self.frame is not None:
            screen = self.screen
            if isinstance(screen, CockpitScreen):
                screen.show(self.frame)

    def note_audit(self, entry: AuditEntry) -> None:
        """Show an accepted change in the audit trail before the next poll."""
        if self.frame is not None:
            self.frame = dataclasses.replace(self.frame, audit=(*self.frame.audit, entry))

    # -- actions ----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Replay keys exist only when replaying (so arrows move table cursors live)."""
        if action in _REPLAY_ACTIONS:
            return self.replay is not None
        return True

    def action_show(self, mode: str) -> None:
        """Switch to a screen."""
        if self.current_mode != mode:
            self.switch_mode(mode)

    def action_help(self) -> None:
        """Open the help screen."""
        self.push_screen(HelpScreen())

    def action_tune(self) -> None:
        """Open the tune dialog."""
        self.push_screen(TuneScreen())

    def action_pause(self) -> None:
        """Stop or resume polling (and playing)."""
        self.paused = not self.paused
        if self.paused and self.replay is not None:
            self._set_playing(False)
        self.notify("paused" if self.paused else "resumed", timeout=2)
        self.rerender()
        if not self.paused:
            self.request_poll()

    def action_interval(self) -> None:
        """Cycle the refresh interval."""
        later = [i for i in INTERVALS if i > self.interval_s]
        self.interval_s = later[0] if later else INTERVALS[0]
        if self._poll_timer is not None:
            self._poll_timer.stop()
        self._poll_timer = self.set_interval(self.interval_s, self._tick)
        if self.replay is not None and self.replay.playing:
            self._set_playing(True)
        self.notify(f"refresh every {self.interval_s:g} s", timeout=2)
        self.rerender()

    def action_toggle_theme(self) -> None:
        """Dark or light."""
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"

    def action_reconnect(self) -> None:
        """Poll now (a reconnect when the cluster had gone)."""
        self.request_poll()

    # -- replay -----------------------------------------------------------------------------
    def _moved(self) -> None:
        self.request_poll()

    def _set_playing(self, on: bool) -> None:
        rep = self.replay
        if rep is None:
            return
        rep.playing = on
        if self._play_timer is not None:
            self._play_timer.stop()
            self._play_timer = None
        if on:
            period = max(0.05, rep.interval_s / rep.speed)
            self._play_timer = self.set_interval(period, self._play_tick)

    def _play_tick(self) -> None:
        rep = self.replay
        if rep is None or not rep.playing:
            self._set_playing(False)
            return
        if self._polling:  # still rendering the last step: drop this tick, not pile up
            return
        rep.step(1)
        if not rep.playing:
            self._set_playing(False)
        self._moved()

    def action_play(self) -> None:
        """Play or stop the replay."""
        rep = self.replay
        if rep is None:
            return
        if not rep.playing and rep.index == rep.total - 1:
            rep.seek(0)
        self._set_playing(not rep.playing)
        self._moved()

    def action_step(self, n: int) -> None:
        """Step the replay ``n`` samples."""
        if self.replay is not None:
            self.replay.step(n)
            self._moved()

    def action_jump(self, fraction: float) -> None:
        """Jump by a fraction of the recording."""
        if self.replay is not None:
            self.replay.jump(fraction)
            self._moved()

    def action_seek(self, index: int) -> None:
        """First (0) or last (-1) sample."""
        rep = self.replay
        if rep is not None:
            rep.seek(rep.total - 1 if index < 0 else index)
            self._moved()

    def action_speed(self, direction: int) -> None:
        """Faster (+1) or slower (-1)."""
        rep = self.replay
        if rep is None:
            return
        i = min(range(len(SPEEDS)), key=lambda k: abs(SPEEDS[k] - rep.speed))
        rep.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + direction))]
        if rep.playing:
            self._set_playing(True)
        self._moved()
