"""Edit values in a config file's YAML text, keeping every other line and comment.

``tune set`` (and anything else that changes a few keys of a user's file) goes through
here rather than re-rendering the file: a user's comments, key order and other keys stay as
written, and only the characters of the values set change. The edited text is re-read as a
config layer to check that each key now holds exactly its new value.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dualpath_cli.config.layers import parse_yaml_text
from dualpath_cli.config.render import atomic_write_text
from dualpath_cli.errors import DualPathError, UsageError

__all__ = ["edit_config_text", "write_config_values"]


def _yaml_scalar(value: object) -> str:
    """``value`` as a one-line YAML scalar that reads back as ``value``."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("...").strip()


def _set_one(text: str, key: str, scalar: str, name: str) -> str:
    """``text`` with ``key`` set to ``scalar``; every other line, comments included, kept."""
    section, field = key.split(".")
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    block = None
    if isinstance(root, yaml.MappingNode):
        block = next((v for k, v in root.value if k.value == section), None)
    if not isinstance(block, yaml.MappingNode):  # no such section yet: append one
        sep = "\n" if text and not text.endswith("\n") else ""
        return f"{text}{sep}{section}:\n  {field}: {scalar}\n"
    if block.flow_style:
        raise UsageError(f"{name}: cannot edit the flow-style {section!r} mapping; "
                         "write it in block style")
    for key_node, value_node in block.value:
        if key_node.value == field:  # replace the value's own characters only
            start, end_index = value_node.start_mark.index, value_node.end_mark.index
            return text[:start] + scalar + text[end_index:]
    indent = " " * block.value[0][0].start_mark.column
    end = block.value[-1][1].end_mark
    if end.column == 0:  # a block scalar ends at the start of the next line
        return f"{text[:end.index]}{indent}{field}: {scalar}\n{text[end.index:]}"
    eol = text.find("\n", end.index)
    eol = len(text) if eol < 0 else eol
    return f"{text[:eol]}\n{indent}{field}: {scalar}{text[eol:]}"


def edit_config_text(text: str, values: dict[str, object], name: str) -> str:
    """Set dotted ``values`` (``section.key``) in config YAML ``text``.

    Args:
        text: the current file content ("" for a new file); must be a valid config layer.
        values: the new values, as YAML would read them (``"3s"``, ``64``, ``True``).
        name: how errors name the file.

    Raises:
        ConfigError: ``text`` is not a valid config layer.
        UsageError: a section to edit is written in flow style (``{alpha: 3s}``).
    """
    parse_yaml_text(text, name, "file")
    for key, value in values.items():
        text = _set_one(text, key, _yaml_scalar(value), name)
    layer = parse_yaml_text(text, name, "file")
    for key, value in values.items():
        if key not in layer or layer[key].raw != value:
            raise DualPathError(f"{name}: internal: {key} did not read back as {value!r}")
    return text


def write_config_values(path: Path, values: dict[str, object]) -> None:
    """Set ``values`` in the config file ``path`` (created with its directory if missing).

    The file is replaced atomically, so a reader sees the old file or the new one.

    Raises:
        UsageError: the file cannot be read or written (one line, naming the file);
            otherwise as :func:`edit_config_text`.
    """
    try:
        old = path.read_text(encoding="utf-8") if path.exists() else ""
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: cannot read: {err}") from None
    text = edit_config_text(old, values, str(path))
    try:
        atomic_write_text(path, text)
    except OSError as err:
        raise UsageError(f"{path}: cannot write: {err.strerror or err}") from None
