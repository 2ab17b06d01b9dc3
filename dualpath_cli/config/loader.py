"""Load the effective configuration: merge layers by precedence, track sources, validate.

Precedence, highest first:

1. flags: ``--set key=value`` (repeatable), then ``--preset NAME``;
2. the file given with ``--config FILE``;
3. environment: ``DUALPATH_<SECTION>__<KEY>`` (e.g. ``DUALPATH_SCHEDULER__ALPHA=8KiB``) and
   ``DUALPATH_PRESET``;
4. user file: ``$DUALPATH_CONFIG_HOME/config.yaml``, else
   ``$XDG_CONFIG_HOME/dualpath/config.yaml``, else ``~/.config/dualpath/config.yaml``;
5. system file: ``$DUALPATH_SYSTEM_CONFIG``, else ``/etc/dualpath/config.yaml``;
6. the selected preset (``preset`` key, itself resolved by the rules above);
7. hardware/model profile values, then built-in defaults.

Missing user/system files are skipped; a missing ``--config`` file is an error.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualpath_cli.config.layers import Layer, env_layer, read_yaml_file, set_layer, suggest
from dualpath_cli.config.model import (
    ClusterConfig,
    Config,
    HardwareConfig,
    ModelConfig,
    PDSpec,
    SchedulerConfig,
    StorageConfig,
    Threshold,
)
from dualpath_cli.config.presets import PRESETS
from dualpath_cli.config.resolve import ResolvedScheduler, ThresholdError, resolve_scheduler
from dualpath_cli.config.schema import CUSTOM, KEYS, Key
from dualpath_cli.config.sources import Entry, Source, field_error
from dualpath_cli.core.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from dualpath_cli.errors import ConfigError, UnitError

__all__ = [
    "Setting",
    "LoadedConfig",
    "SYSTEM_CONFIG",
    "default_user_file",
    "default_system_file",
    "load_config",
    "load_file",
    "load_preset",
    "preset",
]

SYSTEM_CONFIG = Path("/etc/dualpath/config.yaml")
_PROFILES: dict[str, Mapping[str, Any]] = {"hardware": HARDWARE_PROFILES,
                                           "model": MODEL_PROFILES}


@dataclass(frozen=True, slots=True)
class Setting:
    """One effective key: typed value, raw value as written, and where it came from."""

    key: str
    value: Any
    raw: Any
    source: Source


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """The effective config, the source of every key, and the resolved thresholds."""

    config: Config
    settings: Mapping[str, Setting]
    resolved: ResolvedScheduler

    def source(self, key: str) -> Source:
        """Where the effective value of dotted ``key`` came from."""
        return self.settings[key].source

    def raw_values(self) -> dict[str, Any]:
        """``{dotted key: raw value}`` for every key (what ``config init`` writes)."""
        return {key: setting.raw for key, setting in self.settings.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON form of ``config show --json``."""
        return {
            "preset": self.config.preset,
            "settings": {key: {"value": plain(s.value), "given": plain(s.raw),
                               "source": str(s.source)} for key, s in self.settings.items()},
            "resolved": self.resolved.to_dict(),
            "derived": {
                "nodes": self.config.cluster.nodes,
                "prefill_nodes": self.config.cluster.prefill_nodes,
                "decode_nodes": self.config.cluster.decode_nodes,
                "gpus": self.config.cluster.gpus,
                "kv_bytes_per_token": self.config.model.kv_bytes_per_token,
                "node_read_bandwidth": self.config.hardware.node_read_bandwidth,
                "gpu_flops": self.config.hardware_profile.gpu_flops,
            },
        }


def plain(value: Any) -> Any:
    """A JSON-ready form of a typed config value (P/D spec and thresholds as text)."""
    if isinstance(value, (PDSpec, Threshold)):
        return str(value)
    return value


def default_user_file(env: Mapping[str, str]) -> Path:
    """The user config file path for ``env`` (see module docstring)."""
    if env.get("DUALPATH_CONFIG_HOME"):
        return Path(env["DUALPATH_CONFIG_HOME"]).expanduser() / "config.yaml"
    base = env.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base).expanduser() / "dualpath" / "config.yaml"


def default_system_file(env: Mapping[str, str]) -> Path:
    """The system config file path for ``env``."""
    return Path(env["DUALPATH_SYSTEM_CONFIG"]) if env.get("DUALPATH_SYSTEM_CONFIG") \
        else SYSTEM_CONFIG


def load_config(
    *,
    preset: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    user_file: str | os.PathLike[str] | None = None,
    system_file: str | os.PathLike[str] | None = None,
    environment: bool = True,
) -> LoadedConfig:
    """Load the effective configuration.

    Args:
        preset: ``--preset`` flag value (None: from env/files, else ``embedded``).
        config_file: ``--config`` file; must exist.
        overrides: ``--set key=value`` strings, later ones win.
        env: environment to read (default ``os.environ``).
        user_file: user file path (default from ``env``); skipped when missing.
        system_file: system file path (default from ``env``); skipped when missing.
        environment: False reads neither env nor user/system files (``config validate``).

    Raises:
        ConfigError: ``WHERE: key: reason`` for the first bad value found.
    """
    env = os.environ if env is None else env
    layers: list[Layer] = []
    if environment:
        for kind, path in (("system", system_file or default_system_file(env)),
                           ("user", user_file or default_user_file(env))):
            if Path(path).exists():
                layers.append(read_yaml_file(Path(path), kind))  # type: ignore[arg-type]
    if config_file is not None:
        layers.append(read_yaml_file(Path(config_file), "file"))
    if environment:
        layers.append(env_layer(env))
    layers.append(set_layer(overrides, preset))
    merged: Layer = {}
    for layer in layers:
        merged.update(layer)
    return _build(merged)


def load_file(path: str | os.PathLike[str]) -> LoadedConfig:
    """Load one file over the defaults only (no env, no user/system file)."""
    return load_config(config_file=path, environment=False)


def load_preset(name: str) -> LoadedConfig:
    """A preset over the defaults only, with sources."""
    return load_config(preset=name, environment=False)


def preset(name: str) -> Config:
    """The :class:`Config` of preset ``name`` (defaults + preset, nothing else)."""
    return load_preset(name).config


def _preset_entries(merged: Layer) -> tuple[str, Layer]:
    entry = merged.get("preset", Entry("embedded", Source("default")))
    name = entry.raw
    if not isinstance(name, str) or name not in PRESETS:
        raise field_error(entry.source, "preset", f"unknown preset {name!r}"
                          + suggest(str(name), PRESETS) + f" (choices: {', '.join(PRESETS)})")
    source = Source("preset", name)
    layer = {key: Entry(raw, source) for key, raw in PRESETS[name].values.items()}
    layer["preset"] = entry
    return name, layer


def _pick(key: Key, merged: Layer, presets: Layer, chosen: dict[str, Entry]) -> Entry:
    if key.path in merged:
        return merged[key.path]
    if key.path in presets:
        return presets[key.path]
    if key.from_profile is None:
        return Entry(key.default, Source("default"))
    section, attr = key.from_profile
    profile_entry = chosen[f"{section}.profile"]
    name = profile_entry.raw
    if name == CUSTOM:
        raise field_error(profile_entry.source, key.path,
                          f"required when {section}.profile is {CUSTOM!r}")
    profile = _PROFILES[section][str(name)]
    return Entry(getattr(profile, attr), Source("profile", str(name)))


def _build(merged: Layer) -> LoadedConfig:
    _, presets = _preset_entries(merged)
    chosen: dict[str, Entry] = {}
    values: dict[str, Any] = {}
    settings: dict[str, Setting] = {}
    # profile keys come first in KEYS order within a section, but cluster.gpus_per_node
    # depends on hardware.profile, so parse the two profile keys up front.
    ordered = sorted(KEYS, key=lambda k: k.name != "profile")
    for key in ordered:
        entry = _pick(key, merged, presets, chosen)
        chosen[key.path] = entry
        try:
            values[key.path] = key.kind.parse(entry.raw)
        except (UnitError, ValueError, TypeError) as err:
            raise field_error(entry.source, key.path, str(err)) from None
    for key in KEYS:
        settings[key.path] = Setting(key.path, values[key.path], chosen[key.path].raw,
                                     chosen[key.path].source)
    config = _config(values)
    try:
        resolved = resolve_scheduler(config)
    except ThresholdError as err:
        raise field_error(settings[err.key].source, err.key, err.reason) from None
    return LoadedConfig(config, settings, resolved)


def _section(values: Mapping[str, Any], section: str) -> dict[str, Any]:
    prefix = f"{section}."
    return {path[len(prefix):]: value for path, value in values.items()
            if path.startswith(prefix)}


def _config(values: Mapping[str, Any]) -> Config:
    try:
        return Config(
            preset=values["preset"],
            cluster=ClusterConfig(**_section(values, "cluster")),
            hardware=HardwareConfig(**_section(values, "hardware")),
            model=ModelConfig(**_section(values, "model")),
            storage=StorageConfig(**_section(values, "storage")),
            scheduler=SchedulerConfig(**_section(values, "scheduler")),
        )
    except TypeError as err:  # schema and model out of step: a bug, not a user error
        raise ConfigError(f"internal: config schema does not match the model: {err}") from err
