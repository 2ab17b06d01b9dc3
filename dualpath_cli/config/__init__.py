"""Deployment configuration: typed model, presets, layered loading with sources, resolution.

Typical use::

    from dualpath_cli.config import load_config
    loaded = load_config(preset="paper", overrides=["scheduler.alpha=8KiB"])
    loaded.config.cluster.pd            # PDSpec(2, 4)
    loaded.resolved.alpha_tokens        # alpha in tokens, as the scheduler compares it
    str(loaded.source("scheduler.alpha"))  # "flag:--set"
"""

from __future__ import annotations

from dualpath_cli.config.loader import (
    LoadedConfig,
    Setting,
    default_system_file,
    default_user_file,
    load_config,
    load_file,
    load_preset,
    preset,
)
from dualpath_cli.config.model import (
    ClusterConfig,
    Config,
    HardwareConfig,
    ModelConfig,
    PDSpec,
    SchedulerConfig,
    StorageConfig,
    Threshold,
    parse_pd,
)
from dualpath_cli.config.presets import PRESETS, Preset
from dualpath_cli.config.quantities import parse_alpha, parse_beta, parse_quota
from dualpath_cli.config.resolve import (
    ResolvedScheduler,
    ResolvedValue,
    resolve_alpha,
    resolve_beta,
    resolve_quota,
    resolve_scheduler,
)
from dualpath_cli.config.schema import KEYS, Key
from dualpath_cli.config.sources import Source

__all__ = [
    "ClusterConfig",
    "Config",
    "HardwareConfig",
    "KEYS",
    "Key",
    "LoadedConfig",
    "ModelConfig",
    "PDSpec",
    "PRESETS",
    "Preset",
    "ResolvedScheduler",
    "ResolvedValue",
    "SchedulerConfig",
    "Setting",
    "Source",
    "StorageConfig",
    "Threshold",
    "default_system_file",
    "default_user_file",
    "load_config",
    "load_file",
    "load_preset",
    "parse_alpha",
    "parse_beta",
    "parse_pd",
    "parse_quota",
    "preset",
    "resolve_alpha",
    "resolve_beta",
    "resolve_quota",
    "resolve_scheduler",
]
