"""Parse and format every unit the toolkit accepts, in one place.

Conventions (documented in docs/config.md):

* bytes: ``B``, decimal ``KB MB GB TB`` (powers of 1000) and binary ``KiB MiB GiB TiB``
  (powers of 1024). A bare number is bytes.
* tokens: a bare count or ``K`` (1e3), ``M`` (1e6), ``G``/``B`` (1e9); binary ``Ki``/``Mi``
  (1024, 1024**2) when wanted. ``16K`` is 16,000 tokens; ``3.2M`` is 3,200,000.
* durations: ``ns us µs ms s m h``; a bare number is seconds. Returned in seconds.
* bandwidth: bits per second ``bps Kbps Mbps Gbps Tbps`` (also ``Gbit/s``), or bytes per
  second ``B/s KB/s MB/s GB/s TB/s`` and binary ``KiB/s MiB/s GiB/s``. Returned in bytes/s.
* FLOPs: ``FLOP``, ``KFLOP`` ... ``PFLOP`` (an ``S`` suffix is tolerated, as in the seed's
  "20 TFLOPS" used for an amount). Returned in FLOPs.
"""

from __future__ import annotations

import math
import re

from dualpath_cli.errors import UnitError

__all__ = [
    "parse_bytes",
    "format_bytes",
    "parse_tokens",
    "format_tokens",
    "parse_duration",
    "format_duration",
    "parse_bandwidth",
    "format_bandwidth",
    "parse_flops",
    "format_flops",
    "BYTES_FORMS",
    "TOKENS_FORMS",
    "DURATION_FORMS",
    "BANDWIDTH_FORMS",
    "FLOPS_FORMS",
]

_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
# ASCII only: ``\d`` would also take other scripts' digits ("١٢٣"), which float() accepts
_PATTERN = re.compile(rf"^[ \t]*{_NUMBER}[ \t]*(?P<unit>[A-Za-zµ/]*)[ \t]*$", re.ASCII)
#: Longest text read as a number: more digits than any real amount, fewer than the cost of
#: converting thousands of digits (and Python's 4300-digit int limit).
_MAX_TEXT = 64

_BYTE_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}
_TOKEN_UNITS: dict[str, int] = {
    "": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9,
    "ki": 2**10, "mi": 2**20,
}
_DURATION_UNITS: dict[str, float] = {
    "": 1.0, "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0,
    "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
}
_BANDWIDTH_UNITS: dict[str, float] = {
    "bps": 1 / 8, "kbps": 1e3 / 8, "mbps": 1e6 / 8, "gbps": 1e9 / 8, "tbps": 1e12 / 8,
    "bit/s": 1 / 8, "kbit/s": 1e3 / 8, "mbit/s": 1e6 / 8, "gbit/s": 1e9 / 8,
    "tbit/s": 1e12 / 8,
    "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
    "kib/s": 2.0**10, "mib/s": 2.0**20, "gib/s": 2.0**30, "tib/s": 2.0**40,
}
_FLOPS_UNITS: dict[str, float] = {
    "": 1.0, "flop": 1.0, "kflop": 1e3, "mflop": 1e6, "gflop": 1e9, "tflop": 1e12,
    "pflop": 1e15, "eflop": 1e18,
}

BYTES_FORMS = "a byte count like 4096, 8KiB, 4KB, 1.5GiB (KB/MB/GB decimal, KiB/MiB/GiB binary)"
TOKENS_FORMS = "a token count like 512, 16K, 3.2M (K=1e3, M=1e6; Ki=1024)"
DURATION_FORMS = "a duration like 50us, 300ms, 3s, 2m, 1h (a bare number is seconds)"
BANDWIDTH_FORMS = "a bandwidth like 400Gbps, 100Mbps (bits/s) or 50GB/s, 2GiB/s (bytes/s)"
FLOPS_FORMS = "an amount of compute like 20TFLOP, 1.5PFLOP, 3e12"


def _split(value: str | float | int, kind: str, forms: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise UnitError(f"invalid {kind} {value!r}: expected {forms}")
    if isinstance(value, int) and value.bit_length() > 1024:
        raise UnitError(f"invalid {kind}: an integer of {value.bit_length()} bits is too large; "
                        f"expected {forms}")
    if isinstance(value, (int, float)):
        return float(value), ""
    text = str(value)
    if len(text) > _MAX_TEXT:
        raise UnitError(f"invalid {kind} {text[:20]}...: {len(text)} characters is too long "
                        f"for a number; expected {forms}")
    match = _PATTERN.match(text)
    if not match:
        raise UnitError(f"invalid {kind} {value!r}: expected {forms}")
    return float(match.group("num")), match.group("unit")


def _finite_non_negative(number: float, value: object, kind: str, forms: str) -> None:
    # copysign: "-0" is a negative number written by mistake, not zero
    if not math.isfinite(number) or number < 0 or math.copysign(1.0, number) < 0:
        raise UnitError(f"invalid {kind} {value!r}: must be a finite, non-negative amount; "
                        f"expected {forms}")


def _finite_result(number: float, value: object, kind: str, forms: str) -> float:
    """The scaled amount, refused when the unit pushed it past float range (1e308GB/s)."""
    if not math.isfinite(number) or number > 2.0**63:
        raise UnitError(f"invalid {kind} {value!r}: too large; expected {forms}")
    return number


def _scaled(
    value: str | float | int, kind: str, forms: str, table: dict[str, float] | dict[str, int],
    *, case_sensitive: bool = False,
) -> float:
    number, unit = _split(value, kind, forms)
    key = unit if case_sensitive else unit.lower()
    if key not in table:
        raise UnitError(f"invalid {kind} {value!r}: unknown unit {unit!r}; expected {forms}")
    _finite_non_negative(number, value, kind, forms)
    return _finite_result(number * table[key], value, kind, forms)


def parse_bytes(value: str | float | int) -> int:
    """Parse a byte amount ("8KiB", "4KB", 4096) into an integer number of bytes."""
    return int(round(_scaled(value, "byte size", BYTES_FORMS, _BYTE_UNITS)))


def parse_tokens(value: str | float | int) -> int:
    """Parse a token count ("16K", "3.2M", 512) into an integer number of tokens."""
    number, unit = _split(value, "token count", TOKENS_FORMS)
    key = unit.lower()
    if key not in _TOKEN_UNITS:
        raise UnitError(f"invalid token count {value!r}: unknown unit {unit!r}; "
                        f"expected {TOKENS_FORMS}")
    _finite_non_negative(number, value, "token count", TOKENS_FORMS)
    return int(round(_finite_result(number * _TOKEN_UNITS[key], value, "token count",
                                    TOKENS_FORMS)))


def parse_duration(value: str | float | int) -> float:
    """Parse a duration ("50us", "300ms", "3s", "2m") into seconds."""
    number, unit = _split(value, "duration", DURATION_FORMS)
    # "m" is minutes and "ms" milliseconds; "M" is not accepted for minutes to avoid confusion.
    key = unit if unit in ("µs",) else unit.lower()
    if unit == "M" or key not in _DURATION_UNITS:
        raise UnitError(f"invalid duration {value!r}: unknown unit {unit!r}; "
                        f"expected {DURATION_FORMS}")
    _finite_non_negative(number, value, "duration", DURATION_FORMS)
    return _finite_result(number * _DURATION_UNITS[key], value, "duration", DURATION_FORMS)


def parse_bandwidth(value: str | float | int) -> float:
    """Parse a bandwidth ("400Gbps", "50GB/s") into bytes per second.

    Case matters for the b/B distinction: ``Gbps``/``Gb/s`` are bits, ``GB/s`` bytes.
    A bare number is bytes per second.
    """
    number, unit = _split(value, "bandwidth", BANDWIDTH_FORMS)
    if unit == "":
        factor = 1.0
    else:
        lower = unit.lower()
        if lower.endswith("bps") or lower.endswith("bit/s"):
            factor_or_none = _BANDWIDTH_UNITS.get(lower)
        elif unit.endswith("b/s") and not unit.lower().endswith("ib/s"):
            # "Gb/s" written with a lower-case b is bits.
            factor_or_none = _BANDWIDTH_UNITS.get(lower[:-3] + "bit/s")
        else:
            factor_or_none = _BANDWIDTH_UNITS.get(lower)
        if factor_or_none is None:
            raise UnitError(f"invalid bandwidth {value!r}: unknown unit {unit!r}; "
                            f"expected {BANDWIDTH_FORMS}")
        factor = factor_or_none
    _finite_non_negative(number, value, "bandwidth", BANDWIDTH_FORMS)
    return _finite_result(number * factor, value, "bandwidth", BANDWIDTH_FORMS)


def parse_flops(value: str | float | int) -> float:
    """Parse an amount of compute ("20TFLOP", "1.5PFLOP") into FLOPs."""
    number, unit = _split(value, "FLOP amount", FLOPS_FORMS)
    key = unit.lower()
    if key.endswith("flops"):
        key = key[:-1]
    if key not in _FLOPS_UNITS:
        raise UnitError(f"invalid FLOP amount {value!r}: unknown unit {unit!r}; "
                        f"expected {FLOPS_FORMS}")
    _finite_non_negative(number, value, "FLOP amount", FLOPS_FORMS)
    return _finite_result(number * _FLOPS_UNITS[key], value, "FLOP amount", FLOPS_FORMS)


def _trim(number: float) -> str:
    text = f"{number:.3g}" if number < 1000 else f"{number:.0f}"
    if "e" in text:
        text = f"{number:.0f}"
    return text


def _format_scaled(amount: float, steps: list[tuple[float, str]], base_unit: str) -> str:
    for factor, suffix in steps:
        if abs(amount) >= factor:
            return f"{_trim(amount / factor)}{suffix}"
    return f"{_trim(amount)}{base_unit}"


def format_bytes(amount: float, *, binary: bool = True) -> str:
    """Format bytes with binary (KiB) or decimal (KB) prefixes: 8192 -> "8KiB"."""
    if binary:
        steps = [(2.0**50, "PiB"), (2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"),
                 (2.0**10, "KiB")]
    else:
        steps = [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")]
    return _format_scaled(float(amount), steps, "B")


def format_tokens(count: float) -> str:
    """Format a token count: 16000 -> "16K", 3200000 -> "3.2M"."""
    return _format_scaled(float(count), [(1e9, "G"), (1e6, "M"), (1e3, "K")], "")


def format_duration(seconds: float) -> str:
    """Format seconds: 5e-05 -> "50us", 0.3 -> "300ms", 3 -> "3s", 120 -> "2m"."""
    s = float(seconds)
    if s == 0:
        return "0s"
    if abs(s) < 1e-6:
        return f"{_trim(s * 1e9)}ns"
    if abs(s) < 1e-3:
        return f"{_trim(s * 1e6)}us"
    if abs(s) < 1:
        return f"{_trim(s * 1e3)}ms"
    if abs(s) < 120:
        return f"{_trim(s)}s"
    if abs(s) < 7200:
        return f"{_trim(s / 60)}m"
    return f"{_trim(s / 3600)}h"


def format_duration_rounded(seconds: float) -> str:
    """:func:`format_duration` of ``seconds`` first rounded to the 3 significant digits it
    prints, so a value just under a unit converted back from another unit (alpha 1 s ->
    tokens -> 0.99999 s) reads in the larger unit ("1s", not "1000ms")."""
    return format_duration(float(f"{seconds:.3g}"))


def format_bandwidth(bytes_per_s: float, *, bits: bool = False) -> str:
    """Format bytes/s as "50GB/s", or as bits ("400Gbps") with ``bits=True``."""
    if bits:
        return _format_scaled(bytes_per_s * 8, [(1e12, "Tbps"), (1e9, "Gbps"), (1e6, "Mbps"),
                                                (1e3, "Kbps")], "bps")
    return _format_scaled(bytes_per_s, [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"),
                                        (1e3, "KB/s")], "B/s")


def format_flops(amount: float) -> str:
    """Format FLOPs: 2e13 -> "20TFLOP"."""
    return _format_scaled(amount, [(1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"),
                                   (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "KFLOP")], "FLOP")
