"""Read one configuration layer (a YAML file, the environment, ``--set`` flags) into entries.

Every entry keeps its source so that later errors can say ``FILE:LINE: key: reason``. YAML is
read with ``yaml.compose`` so each value still carries its line mark. Unknown keys are refused
here, with the closest known key as a suggestion.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from dualpath_cli.config.schema import KEY_BY_PATH, KEYS, SECTIONS
from dualpath_cli.config.sources import Entry, Source, SourceKind, field_error
from dualpath_cli.errors import ConfigError
from dualpath_cli.limits import LIMITS, limit_value

__all__ = [
    "Layer",
    "ENV_PREFIX",
    "read_yaml_file",
    "parse_yaml_text",
    "env_layer",
    "set_layer",
    "scalar_from_text",
    "suggest",
]

Layer = dict[str, Entry]
ENV_PREFIX = "DUALPATH_"
_TOP_LEVEL = tuple(key.name for key in KEYS if not key.section)


def suggest(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def read_yaml_file(path: Path, kind: SourceKind) -> Layer:
    """Read a YAML config file into a layer; any problem is a ConfigError naming the file.

    At most the ``config_bytes`` limit is read, so ``/dev/zero`` or a runaway file is an
    error rather than all of memory; a directory is refused by name.
    """
    most = int(limit_value("config_bytes"))
    try:
        if path.is_dir():
            raise ConfigError(f"{path}: cannot read config file: a directory")
        with open(path, "rb") as handle:
            data = handle.read(most + 1)
        if len(data) > most:
            raise ConfigError(f"{path}: config file larger than the limit of {most:,} bytes "
                              f"(raise it with {LIMITS['config_bytes'].env_var}=N)")
        text = data.decode("utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config file: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: cannot read config file: not UTF-8 text") from None
    except ValueError:  # a NUL byte in the path
        raise ConfigError(f"{str(path)!r}: cannot read config file: not a usable path"
                          ) from None
    return parse_yaml_text(text, str(path), kind)


def _flow_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting in ``text`` (brackets inside quotes count too: an
    over-estimate, which only matters past the limit). PyYAML recurses once per level, and
    a few thousand levels take seconds before the RecursionError."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}" and depth:
            depth -= 1
    return deepest


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def parse_yaml_text(text: str, name: str, kind: SourceKind) -> Layer:
    """Parse YAML ``text`` (shown as ``name`` in errors) into ``{dotted key: Entry}``."""
    depth = _flow_depth(text)
    most = int(limit_value("nesting"))
    if depth > most:
        raise ConfigError(f"{name}: malformed YAML: nested {depth} levels deep, more than "
                          f"the limit of {most} (raise it with "
                          f"{LIMITS['nesting'].env_var}=N)")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = (err.problem or err.context or "cannot parse").splitlines()[0]
        raise ConfigError(f"{name}{line}: malformed YAML: {problem}") from None
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0] if str(err) else "cannot parse"
        raise ConfigError(f"{name}: malformed YAML: {first}") from None
    except RecursionError:
        raise ConfigError(f"{name}: malformed YAML: nested too deeply") from None
    layer: Layer = {}
    if root is None:
        return layer
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{name}:{_line(root)}: expected a mapping of sections "
                          f"({', '.join(SECTIONS)}) at the top level")
    constructor = yaml.constructor.SafeConstructor()

    def at(node: yaml.Node) -> Source:
        return Source(kind, name, _line(node))

    def leaf(path: str, node: yaml.Node) -> None:
        if not isinstance(node, yaml.ScalarNode):
            raise field_error(at(node), path, "expected a single value, got a "
                              f"{'mapping' if isinstance(node, yaml.MappingNode) else 'list'}")
        try:
            value = constructor.construct_object(node, deep=True)
        except yaml.YAMLError as err:
            first = str(err).splitlines()[0] if str(err) else "not a plain value"
            raise field_error(at(node), path, f"cannot read value: {first}") from None
        except (ValueError, OverflowError, RecursionError):  # a 5,000-digit integer
            raise field_error(at(node), path, "cannot read value: not a usable number "
                              f"({len(str(node.value)):,} characters)") from None
        if value is None:
            raise field_error(at(node), path, "empty value")
        layer[path] = Entry(value, at(node))

    for key_node, value_node in _pairs(root, name, "top level"):
        section = key_node.value
        if section in _TOP_LEVEL:
            leaf(section, value_node)
            continue
        if section not in SECTIONS:
            raise field_error(at(key_node), section, "unknown section"
                              + suggest(section, (*SECTIONS, *_TOP_LEVEL)))
        if not isinstance(value_node, yaml.MappingNode):
            raise field_error(at(value_node), section, "expected a mapping of keys")
        known = [key.name for key in KEYS if key.section == section]
        for sub_node, sub_value in _pairs(value_node, name, section):
            path = f"{section}.{sub_node.value}"
            if path not in KEY_BY_PATH:
                raise field_error(at(sub_node), path, "unknown key"
                                  + suggest(sub_node.value, known))
            leaf(path, sub_value)
    return layer


def _pairs(node: yaml.MappingNode, name: str, where: str) -> list[tuple[yaml.Node, yaml.Node]]:
    """Key/value node pairs of a mapping; keys must be unique strings."""
    seen: set[str] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or not isinstance(key_node.value, str):
            raise ConfigError(f"{name}:{_line(key_node)}: {where}: keys must be plain names")
        if key_node.value in seen:
            raise ConfigError(f"{name}:{_line(key_node)}: {where}: duplicate key "
                              f"{key_node.value!r}")
        seen.add(key_node.value)
    return list(node.value)


def scalar_from_text(text: str) -> object:
    """Read an env or ``--set`` value as a YAML scalar ("true" -> True, "64" -> 64)."""
    try:
        value = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError):
        return text  # the key's own parser then names what is wrong with it
    if isinstance(value, (str, int, float, bool)):
        return value
    return text


def env_layer(env: Mapping[str, str]) -> Layer:
    """Config keys from ``DUALPATH_<SECTION>__<KEY>`` variables (and ``DUALPATH_PRESET``).

    Other DUALPATH_* variables without a double underscore (``DUALPATH_CONFIG_HOME``...) are
    not configuration keys and are ignored.
    """
    by_var = {key.env_var: key.path for key in KEYS}
    layer: Layer = {}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        source = Source("env", var)
        if var in by_var:
            layer[by_var[var]] = Entry(scalar_from_text(env[var]), source)
        elif "__" in var:
            section, _, name = var[len(ENV_PREFIX):].lower().partition("__")
            raise field_error(source, f"{section}.{name}", "unknown key" + suggest(var, by_var))
    return layer


def set_layer(pairs: Iterable[str], preset: str | None = None) -> Layer:
    """Config keys from ``--set key=value`` flags (later flags win) and ``--preset``."""
    layer: Layer = {}
    if preset is not None:
        layer["preset"] = Entry(preset, Source("flag", "--preset"))
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        source = Source("flag", "--set")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected key=value, e.g. "
                              "--set scheduler.alpha=8KiB")
        if key not in KEY_BY_PATH:
            raise field_error(source, key, "unknown key" + suggest(key, KEY_BY_PATH))
        layer[key] = Entry(scalar_from_text(text.strip()), source)
    return layer
