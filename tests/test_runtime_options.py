"""Runtime options say where each scheduler threshold came from (the view's ``source``)."""

from __future__ import annotations

import pytest

from dualpath_cli.config import load_config
from dualpath_cli.errors import ConfigError
from dualpath_cli.runtime.options import RuntimeOptions, options_from_config


def test_threshold_sources_follow_the_config_layers() -> None:
    opts = options_from_config(load_config())
    assert opts.sources == {"alpha": "default", "beta": "default", "z_factor": "default",
                            "quota": "default", "read_side": "default"}
    opts = options_from_config(load_config(overrides=["scheduler.alpha=5KiB"]),
                               policy="round-robin", quota_s=0.1)
    assert opts.sources["alpha"] == "flag" and opts.sources["beta"] == "default"
    assert opts.sources["read_side"] == "flag" and opts.sources["quota"] == "flag"


def test_decision_ring_must_hold_one() -> None:
    with pytest.raises(ConfigError, match="decision_ring must be >= 1"):
        RuntimeOptions(decision_ring=0)
