"""Termination signals held over the sections they must not split (dualpath_cli.termination).

CI once saw ``storage bench`` leave its temp directory behind: SIGTERM landed after
``mkdtemp`` returned and before the ``with`` that removes it was entered."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from dualpath_cli.termination import Terminated, deferred, deliver, temp_dir


def test_a_signal_outside_a_section_raises_at_once() -> None:
    with pytest.raises(Terminated) as got:
        deliver(signal.SIGTERM)
    assert got.value.signum == signal.SIGTERM
    with pytest.raises(KeyboardInterrupt) as ctrl_c:
        deliver(signal.SIGINT)
    assert not isinstance(ctrl_c.value, Terminated)


def test_a_signal_inside_a_section_is_raised_when_the_outermost_one_ends() -> None:
    reached = []
    with pytest.raises(Terminated) as got:
        with deferred():
            with deferred():
                deliver(signal.SIGHUP)
                reached.append("inner body")
            reached.append("after the inner section")  # not raised at the inner end
    assert reached == ["inner body", "after the inner section"]
    assert got.value.signum == signal.SIGHUP
    with deferred():  # nothing left pending
        pass


def test_a_termination_outranks_a_ctrl_c_held_in_the_same_section() -> None:
    with pytest.raises(Terminated) as got, deferred():
        deliver(signal.SIGINT)
        deliver(signal.SIGTERM)
        deliver(signal.SIGINT)
    assert got.value.signum == signal.SIGTERM


def test_a_section_that_fails_raises_the_held_signal_chained_to_its_error() -> None:
    with pytest.raises(Terminated) as got, deferred():
        deliver(signal.SIGTERM)
        raise OSError("disk full")
    assert isinstance(got.value.__cause__, OSError)


def test_sections_on_other_threads_do_not_hold_the_main_threads_signals() -> None:
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with deferred():
            entered.set()
            release.wait(30)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert entered.wait(30)
        with pytest.raises(Terminated):
            deliver(signal.SIGTERM)  # the main thread is in no section: raised now
    finally:
        release.set()
        t.join()


def test_temp_dir_is_removed_after_the_block(tmp_path: Path) -> None:
    with temp_dir(dir=tmp_path, prefix="x-") as made:
        assert made.is_dir() and made.parent == tmp_path and made.name.startswith("x-")
        (made / "file").write_bytes(b"data")
    assert list(tmp_path.iterdir()) == []


_SIGNAL_AS_CREATED = textwrap.dedent("""
    import signal, sys, tempfile
    from pathlib import Path
    from dualpath_cli.cli.app import _unwind_on_termination
    from dualpath_cli.termination import Terminated, temp_dir

    _unwind_on_termination()  # the CLI's handlers
    real = tempfile.mkdtemp

    def mkdtemp(**kw):
        made = real(**kw)
        signal.raise_signal(signal.{sig})  # lands once the directory exists
        return made

    tempfile.mkdtemp = mkdtemp
    try:
        with temp_dir(dir=Path(sys.argv[1])):
            print("body ran")
    except {expect} as err:
        print("raised", type(err).__name__)
""")


@pytest.mark.parametrize(("sig", "expect"), [("SIGTERM", "Terminated"),
                                             ("SIGINT", "KeyboardInterrupt")])
@pytest.mark.e2e
def test_a_real_signal_as_the_temp_dir_is_created_still_removes_it(
        tmp_path: Path, sig: str, expect: str) -> None:
    """The window CI hit, opened on purpose: the real handlers and a real signal raised
    right after ``mkdtemp`` made the directory."""
    script = _SIGNAL_AS_CREATED.format(sig=sig, expect=expect)
    # SIGINT's default disposition in the child: a shell's background job (``cmd &``)
    # inherits SIGINT ignored, and Python then installs no handler of its own for it
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, timeout=60,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == f"raised {expect}", run.stdout  # body never ran
    assert list(tmp_path.iterdir()) == []


_SWALLOWING_MODULE = """
import signal
try:  # what an extension module's init did in CI: ran Python that raised, cleared it
    signal.raise_signal(signal.SIGTERM)
    for _ in range(1000):
        pass
except BaseException:
    pass
"""

_SIGNAL_IN_AN_IMPORT = textwrap.dedent("""
    import sys, threading
    from dualpath_cli.cli.app import _unwind_on_termination
    from dualpath_cli.termination import Terminated

    _unwind_on_termination()  # the CLI's handlers
    sys.path.insert(0, sys.argv[1])
    done = threading.Event()
    try:
        import swallowing  # the signal lands here and would be lost
        print("imported", flush=True)
        done.wait(60)  # the work after it: ends when the held signal is raised
        print("never interrupted")
    except Terminated as err:
        print("raised", err.signum)
""")


@pytest.mark.e2e
def test_a_signal_landing_in_an_import_that_swallows_it_is_raised_after_it(
        tmp_path: Path) -> None:
    """CI's hang: SIGTERM landed while Cython's numpy.random initialised; its init code
    cleared the KeyboardInterrupt and storage bench ran on for its full 60 s."""
    (tmp_path / "swallowing.py").write_text(_SWALLOWING_MODULE)
    run = subprocess.run([sys.executable, "-c", _SIGNAL_IN_AN_IMPORT, str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["imported", f"raised {int(signal.SIGTERM)}"], \
        run.stdout


_SIGNAL_DURING_REMOVAL = textwrap.dedent("""
    import shutil, signal, sys
    from pathlib import Path
    from dualpath_cli.cli.app import _unwind_on_termination
    from dualpath_cli.termination import Terminated, temp_dir

    _unwind_on_termination()
    real = shutil.rmtree

    def rmtree(path, **kw):
        signal.raise_signal(signal.SIGTERM)  # lands as the removal starts
        for _ in range(1000):  # Python work, where a handler would raise
            pass
        real(path, **kw)

    shutil.rmtree = rmtree
    try:
        with temp_dir(dir=Path(sys.argv[1])) as made:
            (made / "file").write_bytes(b"x")
        print("no signal")
    except Terminated:
        print("raised after removal")
""")


@pytest.mark.e2e
def test_a_signal_during_the_removal_is_raised_once_the_directory_is_gone(
        tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", _SIGNAL_DURING_REMOVAL, str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "raised after removal", run.stdout
    assert list(tmp_path.iterdir()) == []
