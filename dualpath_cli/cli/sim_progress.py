"""Progress of a long simulator command on a terminal, and a clean stop on Ctrl-C.

Why here: ``sim capacity`` on a big deployment runs for minutes; an operator must see that
it moves and how far it is, and a Ctrl-C must end it with one line, not a traceback. A
bar is drawn on stderr only when stderr is a terminal and the command prints no JSON, so a
pipe, a log or ``--json`` output holds exactly what it held before. The simulator reports
through its ``progress`` callback (sim/progress.py); this module only renders.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from dualpath_cli.cli import output
from dualpath_cli.sim.progress import ProgressFn, RunProgress

__all__ = ["sim_progress"]


def _console() -> Console:
    """The console the bar draws on (the CLI's stderr; tests swap ``output.stderr``)."""
    return output.stderr


@contextmanager
def sim_progress(what: str, *, as_json: bool) -> Iterator[ProgressFn | None]:
    """A progress callback drawing a bar for ``what`` (``None`` on a pipe or with
    ``--json``: nothing is drawn), removed when the command ends.

    A Ctrl-C (or SIGTERM, termination.py) inside prints one line saying what was stopped
    and how far it was, then goes on (the CLI exits 130 / 128 + signal, silently).
    """
    console = _console()
    last: list[RunProgress] = []
    try:
        if as_json or not console.is_terminal:
            yield None
            return
        with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task(what, total=1.0)

            def report(p: RunProgress) -> None:
                if not last or last[0].label != p.label:
                    bar.update(task, description=f"{what}: {p.label}" if p.label else what)
                last[:] = [p]
                bar.update(task, completed=p.fraction)

            yield report
    except KeyboardInterrupt:
        where = ""
        if last:
            p = last[0]
            where = (f" in run {p.run + 1} of at most {p.runs}" if p.runs > 1 else "") + (
                f" at {p.sim_s:,.0f} simulated s")
        console.print(f"interrupted: {what} stopped{where}; no result", highlight=False,
                      soft_wrap=True)
        raise
