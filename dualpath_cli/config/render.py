"""Render a loaded configuration: display strings for ``config show`` and YAML for ``init``.

``config init`` writes every key: values set by a preset or default are active lines written
exactly as given (so the file loads back to the same values), and values that come from a
hardware/model profile are commented out (so changing ``profile`` still takes effect).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from dualpath_cli.atomicio import atomic_write_text as write_atomically
from dualpath_cli.config.loader import LoadedConfig, plain
from dualpath_cli.config.schema import KEY_BY_PATH, KEYS, SECTIONS
from dualpath_cli.units import (
    format_bandwidth,
    format_bytes,
    format_duration,
    format_flops,
    format_tokens,
)

__all__ = ["display_value", "resolved_text", "render_yaml", "atomic_write_text"]


def display_value(key: str, value: Any, raw: Any = None) -> str:
    """A human form of a value: the text as written when it was text (``"400Gbps"``), else
    the typed value formatted with units (50e9 bytes/s -> ``"50GB/s"``)."""
    if isinstance(raw, str):
        return raw
    kind = KEY_BY_PATH[key].kind.name
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind == "bandwidth":
        return f"{format_bandwidth(value)} ({format_bandwidth(value, bits=True)})"
    if kind == "bytes":
        return format_bytes(value, binary=value % 1000 != 0)
    if kind == "duration":
        return format_duration(value)
    if kind == "FLOP/s":
        return f"{format_flops(value)}/s"
    if kind == "tokens" and value >= 1000:
        return format_tokens(value)
    if kind == "count":
        return format_tokens(value) if value >= 10**6 else str(value)
    return str(plain(value))


def resolved_text(loaded: LoadedConfig, key: str) -> str:
    """The resolved column of ``config show``: thresholds in scheduler units, else blank."""
    name = key.removeprefix("scheduler.")
    if key.startswith("scheduler.") and name in ("alpha", "beta", "compute_quota"):
        value = getattr(loaded.resolved, name)
        if value.unit == "tokens":
            return f"{int(value.value):,} tokens"
        return format_duration(value.value)
    return ""


def _scalar(value: Any) -> str:
    """A YAML scalar that reads back as exactly ``value``."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    elif text.endswith("..."):
        text = text[: -len("...")].strip()
    if isinstance(value, str) and yaml.safe_load(text) != value:
        text = json.dumps(value)
    return text


def render_yaml(loaded: LoadedConfig) -> str:
    """A commented YAML document that loads back to the same effective values."""
    settings = loaded.settings
    lines = [
        "# dualpath configuration (written by `dualpath config init`).",
        "# Every key is listed with its unit and default; see docs/config.md.",
        "# Commented keys take their value from the hardware/model profile.",
        "",
        f"# {KEY_BY_PATH['preset'].doc}",
        f"preset: {_scalar(settings['preset'].raw)}",
    ]
    for section in SECTIONS:
        lines += ["", f"{section}:"]
        for key in (k for k in KEYS if k.section == section):
            setting = settings[key.path]
            default = "from profile" if key.default is None else _scalar(key.default)
            lines.append(f"  # {key.doc} [{key.kind.unit}; default: {default}]")
            text = f"{key.name}: {_scalar(plain(setting.raw))}"
            if setting.source.kind == "profile":
                lines.append(f"  # {text}  # from profile {setting.source.detail}")
            else:
                lines.append(f"  {text}")
    return "\n".join(lines) + "\n"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, creating its directory (config files are 0644)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text)

