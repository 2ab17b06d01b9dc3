"""Generate the key and preset tables of docs/config.md from the schema, so docs cannot drift.

``python -m dualpath_cli.config.docs docs/config.md`` rewrites the generated section in place;
tests/test_config_docs.py fails when the file and the code disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dualpath_cli.config.presets import PRESETS
from dualpath_cli.config.schema import KEYS, Key

__all__ = ["BEGIN", "END", "default_text", "render_keys", "render_presets", "render_section",
           "replace_section"]

BEGIN = "<!-- BEGIN GENERATED: python -m dualpath_cli.config.docs docs/config.md -->"
END = "<!-- END GENERATED -->"


def _yaml_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def default_text(key: Key) -> str:
    """The default as written in the docs: the raw YAML value, or where it comes from."""
    if key.default is None:
        section = key.from_profile[0] if key.from_profile else key.section
        return f"from {section}.profile"
    return _yaml_text(key.default)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_keys() -> str:
    """One markdown table row per key: key, unit, default, env variable, meaning."""
    rows = ["| key | unit | default | env | meaning |", "|---|---|---|---|---|"]
    for key in KEYS:
        meaning = key.doc + (f" Forms: {key.forms}." if key.forms else "")
        rows.append(f"| `{key.path}` | {_cell(key.kind.unit)} | `{default_text(key)}` | "
                    f"`{key.env_var}` | {_cell(meaning)} |")
    return "\n".join(rows)


def render_presets() -> str:
    """One markdown table row per preset with the values it sets."""
    rows = ["| preset | description | sets |", "|---|---|---|"]
    for preset in PRESETS.values():
        sets = ", ".join(f"`{k}={_yaml_text(v)}`" for k, v in preset.values.items())
        sets = sets or "(defaults only)"
        rows.append(f"| `{preset.name}` | {_cell(preset.description)} | {sets} |")
    return "\n".join(rows)


def render_section() -> str:
    """The whole generated section, markers included."""
    return "\n".join([BEGIN, "", "### Keys", "", render_keys(), "", "### Presets", "",
                      render_presets(), "", END])


def replace_section(text: str) -> str:
    """``text`` with its generated section replaced by the current one."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + render_section() + text[end:]


if __name__ == "__main__":  # pragma: no cover - a maintenance command
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/config.md")
    target.write_text(replace_section(target.read_text(encoding="utf-8")), encoding="utf-8")
