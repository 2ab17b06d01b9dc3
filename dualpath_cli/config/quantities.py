"""Parse the scheduler thresholds, which may each be given in more than one unit.

The seed writes alpha in bytes ("8KiB") and the compute quota in FLOPs ("20TFLOP"); the paper
writes alpha and beta as seconds of work ("3s", "5s") and the quota as time ("300ms"). Both
are accepted, and the form is decided by the unit alone:

* a unit ending in ``B`` (``B KB KiB MB MiB GB GiB TB TiB``) is **bytes**;
* a time unit (``ns us µs ms s sec min h``) is **seconds**;
* a FLOP unit (``FLOP KFLOP ... PFLOP``, optional ``S``) is **FLOPs**;
* anything else is a **token** count: a bare number or ``K``/``M``/``G`` (``16K`` = 16,000),
  optionally followed by the word ``tokens``.

A lower-case ``m`` alone is refused as ambiguous (minutes or mega-tokens?). The numbers
themselves are parsed by :mod:`dualpath_cli.units`, the only unit parser.
"""

from __future__ import annotations

import re

from dualpath_cli.config.model import Threshold, ThresholdForm
from dualpath_cli.errors import UnitError
from dualpath_cli.units import parse_bytes, parse_duration, parse_flops, parse_tokens

__all__ = [
    "ALPHA_FORMS",
    "BETA_FORMS",
    "QUOTA_FORMS",
    "parse_alpha",
    "parse_beta",
    "parse_quota",
]

ALPHA_FORMS = ("bytes (8KiB, 4KB), tokens (16K, '16K tokens', 4096) or seconds of reading "
               "(3s)")
BETA_FORMS = "tokens (16K, '16K tokens', 8000) or seconds of GPU work (5s)"
QUOTA_FORMS = "time (300ms, 0.3 = seconds) or FLOPs (20TFLOP, 15TFLOPS)"

_SHAPE = re.compile(r"^\s*(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*"
                    r"(?P<unit>[A-Za-zµ/]*)\s*(?P<word>tokens?|tok)?\s*$", re.IGNORECASE)
_TIME_UNITS = {"ns", "us", "µs", "ms", "s", "sec", "min", "h"}


def _shape(value: object, name: str, forms: str) -> tuple[str, str, bool]:
    """Split ``value`` into (number text, unit, has the word 'tokens')."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UnitError(f"invalid {name} {value!r}: expected {forms}")
    match = _SHAPE.match(str(value))
    if not match:
        raise UnitError(f"invalid {name} {value!r}: expected {forms}")
    return match.group("num"), match.group("unit"), match.group("word") is not None


def _form(unit: str, word: bool, name: str, value: object) -> ThresholdForm:
    if word:
        return "tokens"
    if unit == "m":
        raise UnitError(f"invalid {name} {value!r}: 'm' is ambiguous; write 'min' for minutes "
                        f"or 'M' for millions of tokens")
    lower = unit.lower()
    if "flop" in lower:
        return "flops"
    if lower in _TIME_UNITS:
        return "seconds"
    if lower.endswith("b"):
        return "bytes"
    return "tokens"


def _parse(value: object, name: str, forms: str, allowed: tuple[ThresholdForm, ...],
           bare: ThresholdForm) -> Threshold:
    number, unit, word = _shape(value, name, forms)
    form = bare if (unit == "" and not word) else _form(unit, word, name, value)
    if form not in allowed:
        raise UnitError(f"invalid {name} {value!r}: {name} cannot be given in {form}; "
                        f"expected {forms}")
    text = str(value).strip()
    try:
        amount: float
        if form == "bytes":
            amount = float(parse_bytes(f"{number}{unit}"))
        elif form == "seconds":
            amount = parse_duration(f"{number}{unit}")
        elif form == "flops":
            amount = parse_flops(f"{number}{unit}")
        else:
            amount = float(parse_tokens(f"{number}{unit}"))
    except UnitError as err:
        raise UnitError(f"invalid {name} {value!r}: {err}") from None
    return Threshold(text=text, form=form, amount=amount)


def parse_alpha(value: object) -> Threshold:
    """Alpha, the short-read-queue threshold: bytes, tokens or seconds of reading."""
    return _parse(value, "alpha", ALPHA_FORMS, ("bytes", "tokens", "seconds"), "tokens")


def parse_beta(value: object) -> Threshold:
    """Beta, the unfinished-token limit: tokens or seconds of GPU work."""
    return _parse(value, "beta", BETA_FORMS, ("tokens", "seconds"), "tokens")


def parse_quota(value: object) -> Threshold:
    """The compute quota per batch: time or FLOPs; a bare number is seconds."""
    return _parse(value, "compute quota", QUOTA_FORMS, ("seconds", "flops"), "seconds")
