"""Resource limits: the most work one input may ask of this machine, in one place.

Every input that sizes processes, memory, files or time (engines from P/D, agents, turns,
token lengths, queue depths, block sizes, intervals, request bodies) is checked here before
the work starts, so a typo such as ``--agents 1e9`` or ``--pd 1000P1000D`` is one line
naming the limit and how to raise it, not a machine brought to its knees or a run that
never ends. A limit is raised with its environment variable (``DUALPATH_LIMIT_<NAME>``),
read on every check; the machine-sized defaults (engines, bytes held in memory) come from
the CPU count and the memory available when the check runs.

Pure standard library (no numpy, no psutil) so any layer may import it, like ``units.py``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dualpath_cli.errors import UsageError

__all__ = [
    "LimitError",
    "Limit",
    "LIMITS",
    "limit_value",
    "check",
    "check_count",
    "check_seconds",
    "check_positive_seconds",
    "check_finite",
    "available_memory",
    "ENGINE_MEMORY",
]

#: Resident memory one engine process takes (model, HBM pool, loader buffers), measured
#: on the embedded 1P2D bench (about 150 MiB each, rounded up).
ENGINE_MEMORY = 200 * 2**20


class LimitError(UsageError):
    """An input asks for more than this machine allows (exit 2); says how to raise it."""


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable``), or physical memory if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (OSError, ValueError):
        return 8 * 2**30


def _cpus() -> int:
    return os.cpu_count() or 1


def _engines_default() -> int:
    # one engine process per emulated GPU: bounded by memory and by CPUs (each engine
    # runs a model forward on one BLAS thread; 32 per core is already heavily shared)
    return max(3, min(available_memory() // ENGINE_MEMORY, 32 * _cpus()))


def _memory_fraction(share: int) -> Callable[[], int]:
    return lambda: max(2**20, available_memory() // share)


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit: its name, the default (a number or a function of the machine), and why."""

    name: str
    default: int | float | Callable[[], int | float]
    unit: str
    why: str

    @property
    def env_var(self) -> str:
        """The environment variable that raises (or lowers) it."""
        return f"DUALPATH_LIMIT_{self.name.upper()}"

    def value(self, env: Mapping[str, str] | None = None) -> float:
        """The limit in force: the environment's value when set and valid, else the default."""
        env = os.environ if env is None else env
        text = env.get(self.env_var)
        if text:
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            if math.isfinite(number) and number > 0:
                return number
            raise LimitError(f"{self.env_var}={text!r}: expected a positive number")
        default = self.default() if callable(self.default) else self.default
        return float(default)


_LIMITS = (
    Limit("engines", _engines_default, "engine processes",
          f"one process per engine, about {ENGINE_MEMORY // 2**20} MiB each"),
    Limit("nodes", 10_000, "nodes",
          "every node is built in memory; the paper's largest deployment, 48P96D, has 144"),
    Limit("agents", 100_000, "agents", "one thread and one trajectory per agent"),
    Limit("turns", 100_000, "turns per agent", "every turn is served in order"),
    Limit("total_turns", 1_000_000, "turns in all", "every turn runs the model"),
    Limit("trace_agents", 1_000_000, "agents", "the trace is built in memory"),
    Limit("tokens", 16_000_000, "tokens", "lengths size KV, buffers and traces"),
    Limit("queue_depth", 4096, "reads in flight", "each read holds a buffer"),
    Limit("steps", 64, "bisection steps", "each step is one whole simulation"),
    Limit("block_bytes", lambda: min(2**30, _memory_fraction(16)()), "bytes",
          "a block is built in memory at several times its size"),
    Limit("bench_bytes", 64 * 2**30, "bytes", "bench files are written before reading"),
    Limit("seconds", 86_400.0, "seconds", "a run or interval longer than a day is a typo"),
    Limit("config_bytes", 4 * 2**20, "bytes", "a config file is read whole"),
    Limit("trace_line_bytes", 64 * 2**20, "bytes", "a trace line is read whole"),
    Limit("request_bytes", 16 * 2**20, "bytes", "an HTTP request body is read whole"),
    Limit("api_rate", 5000.0, "requests per second per client address",
          "each request holds the API's event loop (cluster.api_rate_limit)"),
    Limit("nesting", 64, "levels", "deeper YAML or JSON nesting is not configuration"),
)

#: Every limit by name (docs/reliability.md lists them).
LIMITS: dict[str, Limit] = {lim.name: lim for lim in _LIMITS}


def limit_value(name: str, env: Mapping[str, str] | None = None) -> float:
    """The value in force of limit ``name`` (see :data:`LIMITS`)."""
    return LIMITS[name].value(env)


def _shown(number: float) -> str:
    """A number for a message; a huge integer as its size (``str()`` of one past 4,300
    digits raises, and thousands of digits are no message)."""
    if isinstance(number, int) and number.bit_length() > 64:
        return f"a {int(number.bit_length() * 0.30103) + 1}-digit number"
    if isinstance(number, float) and not math.isfinite(number):
        return str(number)
    return f"{int(number):,}" if float(number).is_integer() else f"{number:g}"


def check(name: str, value: float, what: str) -> None:
    """Raise :class:`LimitError` when ``value`` exceeds limit ``name``.

    The message reads ``WHAT: N exceeds the limit of M UNIT on this machine (why); raise it
    with DUALPATH_LIMIT_NAME=...``.
    """
    lim = LIMITS[name]
    most = lim.value()
    huge = isinstance(value, int) and value > 0 and value.bit_length() > 64  # float() overflows
    if huge or not math.isfinite(value) or value > most:
        raise LimitError(f"{what}: {_shown(value)} exceeds "
                         f"the limit of {_shown(most)} {lim.unit} on this machine ({lim.why}); "
                         f"raise it with {lim.env_var}=N")


def check_count(name: str, value: int, what: str, *, least: int = 1) -> int:
    """``value`` when ``least <= value <= limit``, else a one-line error."""
    if value < least:
        raise UsageError(f"{what}: {_shown(value)} is below the minimum {least}")
    check(name, value, what)
    return value


def check_finite(value: float, what: str, *, least: float = 0.0, positive: bool = False
                 ) -> float:
    """``value`` when finite and ``>= least`` (``> least`` with ``positive``), else an error.

    Negative zero is refused where a positive value is needed (``-0.0 > 0`` is False).
    """
    if not math.isfinite(value):
        raise UsageError(f"{what}: {value} is not a finite number")
    if value < least or (positive and value <= least) or (
            value == 0 and least == 0 and math.copysign(1.0, value) < 0):  # "-0": a typo
        bound = f"> {least:g}" if positive else f">= {least:g}"
        raise UsageError(f"{what}: {value:g} is out of range (must be {bound})")
    return value


def check_seconds(value: float, what: str) -> float:
    """A duration: finite, ``>= 0`` and within the ``seconds`` limit."""
    check_finite(value, what)
    check("seconds", value, what)
    return value


def check_positive_seconds(value: float, what: str) -> float:
    """A duration that must be ``> 0`` (intervals, windows, measuring times)."""
    check_finite(value, what, positive=True)
    check("seconds", value, what)
    return value
