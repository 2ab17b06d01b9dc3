"""The fuzz harness shared by tests/test_fuzz_*.py and bench/reliability.py.

A *case* is one input to one front door: a ``dualpath`` command line (run in-process
through Typer's ``CliRunner`` against ``dualpath_cli.cli.app.app``), a config file handed to
``config validate``, or a trace file handed to ``trace stats``. Every case must end in
success or a clean refusal: exit 0, or a non-zero exit whose error is one line
(a :class:`~dualpath_cli.errors.DualPathError` or Click's usage error), never an uncaught
exception, a traceback in the output, or a run past its deadline (a hang).

Work that would start engines, servers or simulations once the input is accepted is
replaced by a stub that raises :class:`Reached`: the input got past every check, which
is a success here (the work itself is tested elsewhere). What sizes that work is checked
before the stub is reached (``dualpath_cli.limits``), so a ``--agents 1e9`` must still be
refused here, not reached.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck
from hypothesis import strategies as st

__all__ = [
    "Reached",
    "Outcome",
    "Sandbox",
    "COMMANDS",
    "argv_strategy",
    "config_text_strategy",
    "trace_bytes_strategy",
    "run_cli",
]

#: Seconds a case may take before it counts as a hang.
CASE_DEADLINE_S = 8.0


class Reached(Exception):  # a signal, not an error
    """The input passed every check and the (stubbed) work would start now."""


class CaseTimeout(BaseException):
    """A case ran past its deadline (raised by SIGALRM in the main thread)."""


@dataclass
class Outcome:
    """What one case did; ``ok`` is the verdict."""

    argv: list[str]
    exit_code: int
    output: str
    ok: bool
    reason: str = ""
    accepted: bool = False  # exit 0, or the stubbed work was reached (not refused)

    def describe(self) -> str:
        """One paragraph for a failure report: the command line, why, and the output tail."""
        return f"dualpath {' '.join(map(repr, self.argv))}: {self.reason}\n{self.output[-2000:]}"


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`CaseTimeout` in the main thread after ``seconds``."""
    def fire(signum: int, frame: object) -> None:
        raise CaseTimeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class Sandbox:
    """A temp directory of paths fuzzed arguments point at, and an environment confined to it.

    Paths that only a read may touch (``/dev/null``, ``/dev/zero``, ``/proc``) are kept apart
    from paths a command may write, so a regression can never replace a device node of the
    machine running the tests: write positions get a socket, a symlink, a directory and
    plain files inside the sandbox instead.
    """

    root: Path
    write_paths: list[str] = field(default_factory=list)
    read_paths: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    _sock: socket.socket | None = None

    @classmethod
    def create(cls, root: Path) -> Sandbox:
        box = cls(root)
        (root / "dir").mkdir()
        (root / "store" / "blocks").mkdir(parents=True)
        (root / "file.txt").write_text("hello\n")
        (root / "empty").write_bytes(b"")
        (root / "binary").write_bytes(bytes(range(256)) * 4)
        (root / "cfg.yaml").write_text("cluster:\n  pd: 1P2D\nscheduler:\n  alpha: 8KiB\n")
        (root / "target.yaml").write_text("cluster:\n  pd: 1P2D\n")
        (root / "link.yaml").symlink_to(root / "target.yaml")
        (root / "dangling").symlink_to(root / "nowhere" / "x")
        sock_path = root / "sock"
        box._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        box._sock.bind(str(sock_path))
        (root / "trace.jsonl").write_text(
            '{"format": "dualpath-trace", "version": 1, "max_len": 64000, "generator": {}}\n')
        (root / "mooncake.jsonl").write_text(
            '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n')
        (root / "deep.yaml").write_text("a: " + "[" * 3000 + "]" * 3000 + "\n")
        (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000 + "\n")
        for name in ("config", "data", "state", "runtime", "cache"):
            (root / "xdg" / name).mkdir(parents=True)
        (root / "xdg" / "runtime").chmod(0o700)
        common = [str(root / n) for n in ("dir", "store", "file.txt", "empty", "binary",
                                          "cfg.yaml", "link.yaml", "dangling", "sock",
                                          "trace.jsonl", "mooncake.jsonl", "new-file",
                                          "dir/new", "missing/x")]
        box.write_paths = common + ["", "."]
        box.read_paths = common + [str(root / "deep.yaml"), str(root / "deep.json"),
                                   "/dev/null", "/dev/zero", "/proc", "/proc/self/status"]
        x = root / "xdg"
        box.env = {"HOME": str(root), "XDG_CONFIG_HOME": str(x / "config"),
                   "XDG_DATA_HOME": str(x / "data"), "XDG_STATE_HOME": str(x / "state"),
                   "XDG_RUNTIME_DIR": str(x / "runtime"), "XDG_CACHE_HOME": str(x / "cache"),
                   "DUALPATH_SYSTEM_CONFIG": str(root / "no-system.yaml"),
                   "NO_COLOR": "1", "COLUMNS": "100", "TERM": "dumb"}
        return box

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()

    def device_nodes_intact(self) -> bool:
        """The sandbox's own special files are still what they were (a write replaced none)."""
        import stat

        return (stat.S_ISSOCK(os.lstat(self.root / "sock").st_mode)
                and (self.root / "link.yaml").is_symlink())


# --- argument strategies ---------------------------------------------------------------

_NASTY_TEXT = ["", " ", "0", "-0", "-1", "1", "nan", "inf", "-inf", "1e308", "1e309",
               "9" * 40, "9" * 5000, "١٢٣", "１２", "½", "0x10", "1_000", "8KiB", "1TiB",
               "1e308GB/s", "0Gbps", "-5s", "3s", "50us", "NaNs", "1P2D", "0P0D", "1000P1000D",
               "99999999P1D", "a,b", ",", "=", "a=b", "scheduler.alpha=8KiB",
               "scheduler.alpha=-0", "cluster.pd=1000P1000D", "storage.block_size=0",
               "\x00", "\n", "é", "🙂", "' OR 1=1 --", "$(reboot)", "%s%n", "{}", "[]",
               "dualpath", "oracle", "embedded", "paper", "tiny", "custom", "perf-drop",
               "http://127.0.0.1:9", "http://[::1", "127.0.0.1:0"]

_INTS = st.one_of(st.integers(-3, 70), st.sampled_from([0, -1, 2**31, 2**63, 10**30,
                                                          1_000_000_000, 10**400]))
_FLOATS = st.one_of(st.sampled_from(["nan", "inf", "-inf", "-0.0", "0", "1e308", "1e-320",
                                     "0.001", "2.5", "1e9"]),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr))


def _text() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(_NASTY_TEXT),
                     st.text(st.characters(exclude_categories=["Cs"]), max_size=12))


def _value(param: Any, box: Sandbox) -> st.SearchStrategy[str]:
    """Strategy for the text of one option/argument value, by its declared type."""
    annotation = str(param.type_descriptor.annotation)
    name = param.name or ""
    reads_only = name in ("trace", "from_", "from", "file", "path", "recording")
    paths = st.sampled_from(box.read_paths + box.write_paths if reads_only
                            else box.write_paths)
    if "Path" in annotation:
        return paths
    if "int" in annotation and "list" not in annotation:
        return st.one_of(_INTS.map(str), _text())
    if "float" in annotation:
        return st.one_of(_FLOATS, _text())
    if name in ("output", "url", "trace", "config"):
        return st.one_of(paths, _text())
    return _text()


def _plain_default(param: Any) -> str | None:
    """The option's default as command-line text, when it is a plain number or word."""
    value = param.default
    if isinstance(value, bool) or value is None or not isinstance(value, (str, int, float)):
        return None
    return str(value)


@dataclass(frozen=True)
class Command:
    """One leaf command: its words and its parameters (click objects)."""

    words: tuple[str, ...]
    params: tuple[Any, ...]


def _commands() -> list[Command]:
    import typer.main

    from dualpath_cli.cli.app import _click_module, app
    from dualpath_cli.plugins import get_manager

    click = _click_module()
    get_manager().install_commands(app)
    root = typer.main.get_command(app)
    found: list[Command] = []

    def walk(cmd: Any, words: tuple[str, ...]) -> None:
        if hasattr(cmd, "list_commands"):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), (*words, name))
        else:
            found.append(Command(words, tuple(p for p in cmd.params if p.name != "help")))

    walk(root, ())
    return found


COMMANDS: list[Command] = []


def commands() -> list[Command]:
    """Every leaf command of ``dualpath`` (built once)."""
    if not COMMANDS:
        COMMANDS.extend(_commands())
    return COMMANDS


def argv_strategy(command: Command, box: Sandbox) -> st.SearchStrategy[list[str]]:
    """Command lines for ``command``: a random subset of its options with fuzzed values,
    its arguments, occasionally an unknown option or a stray word."""

    @st.composite
    def build(draw: st.DrawFn) -> list[str]:
        argv = list(command.words)
        tail: list[str] = []
        # half the cases fuzz one parameter and keep the others at their defaults, so that
        # a case gets past the parser often enough to reach the checks behind it
        focus = draw(st.integers(-1, len(command.params) - 1)) if draw(st.booleans()) else None
        for index, param in enumerate(command.params):
            is_arg = param.param_type_name == "argument"
            if not is_arg and not param.required and not draw(st.booleans()):
                continue
            if getattr(param, "is_flag", False):
                argv.append(param.opts[0])
                continue
            plain = _plain_default(param)
            if focus is not None and index != focus and not is_arg:
                if plain is not None:
                    argv += [param.opts[0], plain]
                continue
            repeats = draw(st.integers(1, 3)) if (param.multiple or param.nargs == -1) else 1
            for _ in range(repeats):
                value = draw(_value(param, box))
                if is_arg:
                    tail.append(value)
                else:
                    argv += [draw(st.sampled_from(param.opts)), value]
        if draw(st.integers(0, 19)) == 0:
            argv.append(draw(st.sampled_from(["--no-such-option", "extra", "-", "--"])))
        return argv + tail

    return build()


# --- file strategies ---------------------------------------------------------------------

_CONFIG_KEYS = ["cluster.pd", "cluster.gpus_per_node", "scheduler.alpha", "scheduler.beta",
                "scheduler.compute_quota", "storage.block_size", "storage.root",
                "hardware.snic_bandwidth", "hardware.profile", "model.profile", "preset",
                "nosuch.key", "scheduler.nosuch"]
_SCALARS = st.one_of(
    st.sampled_from(["8KiB", "1P2D", "1000000P1D", "-0", "nan", ".inf", "1e308", "9" * 5000,
                     "١٢٣", "~", "null", "true", "[1, 2]", "{a: 1}", "&a x", "*a", "!!binary "
                     "AAAA", "!!python/object:os.system x", "'quoted'", '"\\x00"',
                     "64", "0", "-1", "4096", "1e9", "2.5", "🙂"]),
    st.integers(-2**70, 2**70).map(str), st.floats().map(repr),
    st.text(max_size=20).map(lambda s: repr(s)))


@st.composite
def _config_doc(draw: st.DrawFn) -> bytes:
    lines: dict[str, list[str]] = {}
    for key in draw(st.lists(st.sampled_from(_CONFIG_KEYS), max_size=6)):
        section, _, name = key.rpartition(".")
        lines.setdefault(section, []).append(f"{name}: {draw(_SCALARS)}")
    out = []
    for section, items in lines.items():
        if section:
            out.append(f"{section}:")
            out += [f"  {item}" for item in items]
        else:
            out += items
    text = "\n".join(out) + "\n"
    mutation = draw(st.integers(0, 5))
    data = text.encode()
    if mutation == 1:  # truncated
        data = data[:draw(st.integers(0, max(0, len(data) - 1)))]
    elif mutation == 2:  # binary noise spliced in
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(max_size=16)) + data[at:]
    elif mutation == 3:  # bad indentation / tabs
        data = data.replace(b"  ", b"\t", 1)
    return data


def config_text_strategy() -> st.SearchStrategy[bytes]:
    """Config file contents: valid and broken YAML, wrong types, huge values, unicode,
    binary, deep nesting."""
    return st.one_of(
        _config_doc(),
        st.binary(max_size=64),
        st.text(max_size=64).map(str.encode),
        st.integers(1, 4000).map(lambda n: ("a: " + "[" * n + "]" * n).encode()),
        st.integers(1, 4000).map(lambda n: ("{a: " * n + "1" + "}" * n).encode()),
        st.sampled_from([b"", b"---\n...\n", b"- 1\n- 2\n", b"cluster: [1, 2]\n",
                         b"cluster:\n  pd: &x 1P2D\n  gpus_per_node: *x\n",
                         b"a: &a [*a]\n", b"\xff\xfe\x00c\x00", b"cluster:\n  pd: 1P2D\n" * 3]))


_TRACE_HEADER = {"format": "dualpath-trace", "version": 1, "max_len": 64000,
                 "generator": {"name": "fuzz"}}
_FIELD_VALUES: st.SearchStrategy[Any] = st.one_of(st.integers(-10, 70000), st.sampled_from(
    [10**30, -(10**30), 2**63, 1.5, float("inf"), None, "12", True, [], {}, [1, 2]]))


@st.composite
def _dualpath_trace(draw: st.DrawFn) -> bytes:
    import json

    header = dict(_TRACE_HEADER)
    if draw(st.integers(0, 3)) == 0:
        header[draw(st.sampled_from(list(header)))] = draw(_FIELD_VALUES)
    lines = [json.dumps(header)]
    for agent in range(draw(st.integers(0, 3))):
        turns = [{"append": draw(_FIELD_VALUES), "gen": draw(_FIELD_VALUES)}
                 for _ in range(draw(st.integers(0, 3)))]
        obj: dict[str, Any] = {"agent_id": agent, "turns": turns}
        if draw(st.booleans()):
            obj[draw(st.sampled_from(["agent_id", "turns", "extra"]))] = draw(_FIELD_VALUES)
        lines.append(json.dumps(obj))
    return _mutate(draw, ("\n".join(lines) + "\n").encode())


@st.composite
def _mooncake_trace(draw: st.DrawFn) -> bytes:
    import json

    lines = []
    for _ in range(draw(st.integers(1, 4))):
        obj = {"timestamp": draw(_FIELD_VALUES), "input_length": draw(_FIELD_VALUES),
               "output_length": draw(_FIELD_VALUES),
               "hash_ids": draw(st.one_of(st.lists(_FIELD_VALUES, max_size=4),
                                          _FIELD_VALUES))}
        lines.append(json.dumps(obj))
    return _mutate(draw, ("\n".join(lines) + "\n").encode())


def _mutate(draw: st.DrawFn, data: bytes) -> bytes:
    kind = draw(st.integers(0, 5))
    if kind == 1:
        return data[:draw(st.integers(0, max(0, len(data) - 1)))]
    if kind == 2:
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.sampled_from([b"\xff\xfe", b"\x00", b"\xc3", b"\n\n"])) \
            + data[at:]
    if kind == 3:
        return data.replace(b"1", b"9" * 5000, 1)
    return data


def trace_bytes_strategy() -> st.SearchStrategy[bytes]:
    """Trace files in both formats: valid, truncated, wrong types, negative and enormous
    lengths, non-UTF-8, deep nesting."""
    return st.one_of(_dualpath_trace(), _mooncake_trace(), st.binary(max_size=64),
                     st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n + b"\n"))


# --- running a case ------------------------------------------------------------------------

def _stubs() -> list[tuple[Any, str, Callable[..., Any]]]:
    """(module, attribute, replacement): work that starts once the input is accepted."""
    import dualpath_cli.cli.bench_remote as bench_remote
    import dualpath_cli.cli.drill_cmd as drill_cmd
    import dualpath_cli.cli.local_launch as local_launch
    import dualpath_cli.services.bench as bench
    import dualpath_cli.sim as sim
    import dualpath_cli.storage.benchmark as storage_bench
    import dualpath_cli.workload.build as build

    def reached(*args: Any, **kwargs: Any) -> Any:
        raise Reached()

    real_trace = build.synthetic_trace

    def small_trace(max_len: int, agents: int, seed: int, **kwargs: Any) -> Any:
        if agents > 2000 or kwargs.get("base_agents", 0) > 2000 or max_len > 200_000:
            raise Reached()  # accepted, and bounded by the limits; too slow for a fuzz case
        return real_trace(max_len, agents, seed, **kwargs)

    stubs: list[tuple[Any, str, Callable[..., Any]]] = [
        (bench, "run_bench", reached), (bench, "calibrate_by_oracle", reached),
        (bench_remote, "bench_url", reached), (local_launch, "serve", reached),
        (local_launch, "detach", reached),  # its child is a real cluster that outlives the case
        (storage_bench, "make_dataset", reached), (build, "synthetic_trace", small_trace),
        (drill_cmd.DrillSessions, "first", reached)]  # a drill launches or attaches a cluster
    for name in ("simulate_offline", "simulate_online", "simulate_capacity"):
        if hasattr(sim, name):
            stubs.append((sim, name, reached))
    return stubs


@contextlib.contextmanager
def stubbed() -> Iterator[None]:
    """Apply :func:`_stubs` for the duration (restored after, even on failure)."""
    import typer.main
    import typer.testing

    from dualpath_cli.cli.app import app

    built = typer.main.get_command(app)  # once, not per case (it is most of a case's time)
    saved: list[tuple[Any, str, Any]] = [(typer.testing, "_get_command",
                                          typer.testing._get_command)]
    setattr(typer.testing, "_get_command", lambda typer_instance: built)  # noqa: B010
    for module, name, repl in _stubs():
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, repl)
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def run_cli(argv: list[str], box: Sandbox, *, deadline_s: float = CASE_DEADLINE_S) -> Outcome:
    """Run one command line in-process and judge it (see the module docstring)."""
    from typer.testing import CliRunner

    from dualpath_cli.cli.app import app
    from dualpath_cli.errors import DualPathError

    runner = CliRunner()
    here = os.getcwd()
    os.chdir(box.root)  # a relative path a fuzzed argument names lands in the sandbox
    try:
        with deadline(deadline_s):
            result = runner.invoke(app, argv, env=box.env, catch_exceptions=True)
    except CaseTimeout:
        return Outcome(argv, -1, "", False, f"hang: still running after {deadline_s:g} s")
    finally:
        os.chdir(here)
    output = result.output
    exc = result.exception
    if isinstance(exc, CaseTimeout):
        return Outcome(argv, -1, output, False, f"hang: still running after {deadline_s:g} s")
    if exc is not None and not isinstance(exc, (SystemExit, Reached, DualPathError)):
        tb = "".join(traceback.format_exception(exc))
        return Outcome(argv, result.exit_code, output + tb, False,
                       f"uncaught {type(exc).__name__}: {str(exc)[:200]}")
    if isinstance(exc, DualPathError) and ("\n" in str(exc).strip() or not str(exc).strip()):
        return Outcome(argv, result.exit_code, output, False,
                       f"error message is not one line: {str(exc)!r}")
    if "Traceback (most recent call last)" in output:
        return Outcome(argv, result.exit_code, output, False, "traceback in the output")
    if not box.device_nodes_intact():
        return Outcome(argv, result.exit_code, output, False,
                       "a special file or symlink was replaced by a regular file")
    if result.exit_code not in (0, None) and not isinstance(exc, (DualPathError, Reached)) \
            and not output.strip():
        return Outcome(argv, result.exit_code, output, False,
                       f"exit {result.exit_code} without a message")
    if isinstance(exc, DualPathError):
        output += f"error: {exc}\n"  # what main() prints for it
    accepted = isinstance(exc, Reached) or (exc is None and not result.exit_code)
    return Outcome(argv, result.exit_code or 0, output, True, accepted=accepted)


# --- HTTP ------------------------------------------------------------------------------

def _http_reason(status: int, body: str) -> str:
    """Why a response fails the rule (a 4xx names its reason, never a 5xx), or ''."""
    if status >= 500:
        return f"HTTP {status}: {body[:200]}"
    if 400 <= status < 500:
        import json

        try:
            payload = json.loads(body)
        except ValueError:
            return f"HTTP {status} without a JSON reason: {body[:120]!r}"
        text = payload.get("detail") or payload.get("error") if isinstance(payload, dict) else None
        if not text:
            return f"HTTP {status} without a reason: {body[:120]!r}"
    return ""


def run_http_fuzz(app: Any, token: str, examples: int, seed: int = 0,
                  after_each: Callable[[], None] | None = None) -> list[Outcome]:
    """Every operation of ``app``'s OpenAPI document, ``examples`` generated requests each,
    sent with and without the bearer token (in-process ASGI, schemathesis). A case passes
    with a 2xx/3xx, or a 4xx whose JSON body names the reason; a 5xx or an exception fails.
    ``after_each`` runs after every request (tests clear injected faults there)."""
    import schemathesis

    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    outcomes: list[Outcome] = []
    for result in schema.get_all_operations():
        _fuzz_operation(result.ok(), token, examples, seed, after_each,  # type: ignore[union-attr]
                        outcomes)
    return outcomes


def _fuzz_operation(op: Any, token: str, examples: int, seed: int,
                    after_each: Callable[[], None] | None, outcomes: list[Outcome]) -> None:
    """:func:`run_http_fuzz` for one operation (a function, so each gets its own label)."""
    from hypothesis import Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    label = op.label

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(op.as_strategy())
    def one(case: Any) -> None:
        for with_token in (True, False):
            headers = {"Authorization": f"Bearer {token}"} if with_token else {}
            argv = [label, "with token" if with_token else "without token"]
            try:
                with deadline(CASE_DEADLINE_S):
                    response = case.call(headers=headers)
            except CaseTimeout:
                outcomes.append(Outcome(argv, -1, "", False, "hang"))
                continue
            except Exception as err:  # a transport error is a failure of the server
                outcomes.append(Outcome(argv, -1, "", False,
                                        f"{type(err).__name__}: {err}"))
                continue
            finally:
                if after_each is not None:
                    after_each()
            reason = _http_reason(response.status_code, response.text)
            outcomes.append(Outcome(argv, response.status_code, response.text[:500],
                                    not reason, reason, response.status_code < 400))

    one()
