"""The cockpit's dialogs: help, the tune dialog and its confirmation.

Why the tune dialog confirms: a change reaches the running scheduler at once (through the
API's PATCH, with the token, audited), so the operator sees old -> new, the token id it goes
out under and the twin's predicted effect (when that service is installed) before saying yes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from dualpath_cli.errors import DualPathError
from dualpath_cli.telemetry.view import ClusterView, Decision
from dualpath_cli.tui.cockpit import Cockpit
from dualpath_cli.tui.format import fmt_audit
from dualpath_cli.units import format_duration, format_tokens

__all__ = ["HelpScreen", "TuneScreen", "ConfirmScreen", "HELP_TEXT"]

HELP_TEXT = """\
dualpath top: keys

  1  cluster    engines: role, node, state, class, load vs alpha/beta, HBM, NICs
  2  nic        PE/DE x storage/compute NIC: trends and Max/Avg imbalance
  3  layers     per-layer hits by tier (heat map) and load-ahead slack
  4  requests   turns in flight; up/down selects, its story shows below
                (l: the recent decisions instead)
  5  alerts     diagnose findings over the window with the action (o: show OK)

  t  tune alpha/beta/quota (F2 asks the twin's predicted effect; enter applies
     after a confirmation; shows the token id and the audit trail)
  p  pause / resume        i  refresh interval (0.5, 1, 2, 5 s)
  d  dark / light          r  reconnect now
  ?  this help             q  quit

  cluster screen: s next sort column, S reverse, / filter, esc clear filter,
                  click a header to sort by it
  replay (--from FILE): space play/pause, left/right step, [ ] jump 10%,
                  home/end first/last sample, + - speed

  classes: overloaded (tokens > beta), short-rq (read queue <= alpha),
           long-rq (read queue > alpha), down (engine not ready)
"""


class HelpScreen(ModalScreen[None]):
    """The keys, in one place."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90; max-width: 100%; height: auto;
                                  max-height: 100%; border: round $primary;
                                  background: $surface; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(HELP_TEXT, id="help-text", markup=False)
            yield Label("esc closes")

    def on_mount(self) -> None:
        self.set_class(cast(Cockpit, self.app).ascii_only, "ascii")


def _change_text(old: dict[str, str], new: dict[str, str]) -> str:
    return ", ".join(f"{k} {old.get(k, '?')} -> {v}" for k, v in new.items())


class ConfirmScreen(ModalScreen[bool]):
    """``apply alpha 2K -> 1K to URL under tok-xxxx? y/n``."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)",
                                                            "No")]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 76; max-width: 100%; height: auto;
                               border: thick $warning; background: $surface; padding: 0 1; }
    ConfirmScreen Horizontal { height: auto; }
    """

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.text, id="confirm-text", markup=False)
            with Horizontal():
                yield Button("Yes, apply (y)", id="yes", variant="warning")
                yield Button("No (n)", id="no")

    def on_mount(self) -> None:
        self.set_class(cast(Cockpit, self.app).ascii_only, "ascii")

    def action_answer(self, yes: bool) -> None:
        """Close with the answer."""
        self.dismiss(yes)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class TuneScreen(ModalScreen[None]):
    """alpha, beta, quota with the current values, the predicted effect, the audit trail."""

    BINDINGS = [Binding("escape", "dismiss", "Close"),
                Binding("f2", "predict", "Predict effect", priority=True)]
    DEFAULT_CSS = """
    TuneScreen { align: center middle; }
    TuneScreen > Vertical { width: 84; max-width: 100%; height: auto; max-height: 100%;
                            border: round $primary; background: $surface; padding: 0 1; }
    TuneScreen .row { height: 3; }
    TuneScreen .row Label { width: 8; padding: 1 0; }
    TuneScreen .row Input { width: 20; }
    TuneScreen .row .now { width: 1fr; padding: 1 1; }
    TuneScreen #predicted { height: auto; color: $text-muted; }
    TuneScreen #tune-error { height: auto; color: $error; }
    TuneScreen #audit { height: auto; max-height: 6; }
    TuneScreen Horizontal.buttons { height: 3; }
    """

    FIELDS = ("alpha", "beta", "quota")

    def __init__(self) -> None:
        super().__init__()
        self._applied: dict[str, str] = {}

    @property
    def top(self) -> Cockpit:
        """The app, as a screen may use it."""
        return self.app  # type: ignore[return-value]

    def current(self) -> dict[str, str]:
        """The values in force, in the CLI's units."""
        frame = self.top.frame
        if frame is None or frame.view is None:
            return {}
        th = frame.view.scheduler.thresholds
        return {"alpha": format_tokens(th.alpha_tokens), "beta": format_tokens(th.beta_tokens),
                "quota": format_duration(th.quota_s), **self._applied}

    def compose(self) -> ComposeResult:
        now = self.current()
        frame = self.top.frame
        src = {} if frame is None or frame.view is None else \
            frame.view.scheduler.thresholds.source
        with Vertical():
            yield Label("tune the running scheduler (units as on the CLI: 200K, 1s, 300ms)")
            for name in self.FIELDS:
                with Horizontal(classes="row"):
                    yield Label(name)
                    yield Input(now.get(name, ""), id=f"in-{name}")
                    yield Static(f"now {now.get(name, 'n/a')} ({src.get(name, 'config')})",
                                 classes="now", id=f"now-{name}", markup=False)
            yield Static("", id="predicted", markup=False)
            yield Static(self._token_text(), id="token", markup=False)
            yield Static("", id="tune-error", markup=False)
            with Horizontal(classes="buttons"):
                source = self.top.source
                yield Button("Apply", id="apply", variant="primary",
                             disabled=source.read_only or not source.token_id)
                yield Button("Predict (F2)", id="predict",
                             disabled=self.top.predictor is None)
                yield Button("Close (esc)", id="close")
            yield Label("audit trail")
            yield Static(self._audit_text(), id="audit", markup=False)

    def on_mount(self) -> None:
        self.set_class(self.top.ascii_only, "ascii")
        self._predict()

    def _token_text(self) -> str:
        source = self.top.source
        if source.read_only:
            return "replay: a recording is read-only (nothing can be applied)"
        if not source.token_id:
            return ("no token: read-only (set DUALPATH_TOKEN, or run on the host that "
                    "launched the cluster)")
        return f"token {source.token_id} (changes are audited under this id)"

    def _audit_text(self) -> str:
        frame = self.top.frame
        audit = () if frame is None else frame.audit
        if not audit:
            return "no changes yet"
        return "\n".join(fmt_audit(a) for a in list(audit)[-5:])

    def change(self) -> dict[str, str]:
        """The fields the operator changed (the others are not sent)."""
        now = self.current()
        out = {}
        for name in self.FIELDS:
            value = self.query_one(f"#in-{name}", Input).value.strip()
            if value and value != now.get(name):
                out[name] = value
        return out

    def _predict(self) -> None:
        """Say what the predicted-effect line can do now (the twin runs on request)."""
        change = self.change()
        if self.top.predictor is None:
            text = "predicted effect: n/a (the tuning twin service is not installed)"
        elif not change:
            text = "predicted effect: change a value, then F2 (the twin replays the window)"
        else:
            text = "predicted effect: F2 asks the twin (it takes seconds)"
        self.query_one("#predicted", Static).update(text)

    def action_predict(self) -> None:
        """Ask the twin for the change's predicted effect (in a worker thread)."""
        frame = self.top.frame
        change = self.change()
        if self.top.predictor is None or not change:
            self._predict()
            return
        if frame is None or frame.view is None:
            self.query_one("#predicted", Static).update("predicted effect: n/a (no view yet)")
            return
        self.query_one("#predicted", Static).update("predicted effect: the twin is "
                                                    "replaying the window...")
        self._run_twin(frame.view, frame.decisions, change)

    @work(thread=True, exclusive=True, group="twin", exit_on_error=False)
    def _run_twin(self, view: ClusterView, decisions: Sequence[Decision],
                  change: dict[str, str]) -> None:
        predictor = self.top.predictor
        assert predictor is not None
        try:
            text = "predicted effect: " + predictor(view, decisions, change)
        except DualPathError as err:
            text = f"predicted effect: the twin cannot predict this: {err}"
        except Exception as err:  # noqa: BLE001 - an optional service must not end the dialog
            text = f"predicted effect: the twin failed: {type(err).__name__}: {err}"
        self.app.call_from_thread(self._show_prediction, change, text)

    def _show_prediction(self, change: dict[str, str], text: str) -> None:
        if self.is_attached and change == self.change():
            self.query_one("#predicted", Static).update(text)

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        self._predict()

    @on(Button.Pressed, "#predict")
    def _predict_pressed(self, event: Button.Pressed) -> None:
        self.action_predict()

    @on(Button.Pressed, "#close")
    def _close(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    @on(Input.Submitted)
    @on(Button.Pressed, "#apply")
    def _apply(self, event: object) -> None:
        if self.query_one("#apply", Button).disabled:
            self.query_one("#tune-error", Static).update(self._token_text())
            return
        change = self.change()
        if not change:
            self.query_one("#tune-error", Static).update("nothing changed")
            return
        source = self.top.source
        text = (f"apply {_change_text(self.current(), change)}\nto {source.label} under "
                f"token {source.token_id}?")
        self.app.push_screen(ConfirmScreen(text), lambda yes: self._confirmed(bool(yes),
                                                                             change))

    def _confirmed(self, yes: bool, change: dict[str, str]) -> None:
        if not yes:
            self.query_one("#tune-error", Static).update("not applied")
            return
        try:
            entry = self.top.source.tune(**change)
        except DualPathError as err:
            self.query_one("#tune-error", Static).update(f"refused: {err}")
            return
        self.query_one("#tune-error", Static).update("")
        old = self.current()
        self._applied.update(change)
        for name, value in change.items():
            self.query_one(f"#now-{name}", Static).update(f"now {value} (api, just applied)")
        self.app.notify(f"{_change_text(old, change)} (live; audit #{entry.seq})",
                        title="tuned")
        self.top.note_audit(entry)
        self.query_one("#audit", Static).update(self._audit_text())
        self.top.request_poll()
