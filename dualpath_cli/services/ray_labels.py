"""Ray node labels as ``--ray-*-label`` takes them: parse a selector, match a node's labels,
format it back (Ray's ``label_selector`` rules, checked here so that a bad flag or a
cluster without such a node is one line instead of Ray waiting forever)."""

from __future__ import annotations

import re

from dualpath_cli.errors import UsageError

__all__ = ["parse_label", "label_matches", "format_label"]

#: A label key as Ray (and Kubernetes) takes it: an optional DNS prefix and ``/``, a name.
_LABEL_KEY = re.compile(r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]{0,251}[a-zA-Z0-9])?/)?"
                        r"[a-zA-Z0-9](?:[a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?$")
_LABEL_VALUE = r"[a-zA-Z0-9](?:[a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
#: A selector's value: ``VALUE``, ``in(A,B)``, each optionally negated with ``!``.
_LABEL_EXPR = re.compile(rf"^!?(?:{_LABEL_VALUE}|in\({_LABEL_VALUE}(?:, ?{_LABEL_VALUE})*\))$")


def parse_label(flag: str, text: str) -> dict[str, str]:
    """``KEY=VALUE[,KEY=VALUE...]`` (``--ray-prefill-label``) as Ray's ``label_selector``.

    A value may be ``in(A,B)`` (any of them) and may start with ``!`` (not it), as in Ray.

    Raises:
        UsageError: not that form, or a key or value Ray would refuse.
    """
    pairs: dict[str, str] = {}
    depth, start, parts = 0, 0, []
    for i, ch in enumerate(text):  # split on the commas outside in(...)
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in parts:
        key, sep, value = (x.strip() for x in part.partition("="))
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_EXPR.match(value):
            raise UsageError(f"{flag} {text!r}: expected KEY=VALUE[,KEY=VALUE...], a Ray node "
                             "label such as dualpath.role=prefill (VALUE may be in(A,B), "
                             "either may start with !)")
        pairs[key] = value
    return pairs


def label_matches(labels: dict[str, str], selector: dict[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies ``selector`` (Ray's rules: see above)."""
    for key, expr in selector.items():
        negated = expr.startswith("!")
        body = expr[1:] if negated else expr
        if body.startswith("in(") and body.endswith(")"):
            hit = labels.get(key) in {v.strip() for v in body[3:-1].split(",")}
        else:
            hit = labels.get(key) == body
        if hit == negated:
            return False
    return True


def format_label(selector: dict[str, str]) -> str:
    """``KEY=VALUE,...`` (for messages and ``ray start --labels``)."""
    return ",".join(f"{k}={v}" for k, v in selector.items())
