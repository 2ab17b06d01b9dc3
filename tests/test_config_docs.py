"""docs/config.md lists every key with the code's unit and default (so docs cannot drift)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from dualpath_cli.config import KEYS, PRESETS
from dualpath_cli.config.docs import BEGIN, END, default_text, render_section
from dualpath_cli.config.model import (
    ClusterConfig,
    HardwareConfig,
    ModelConfig,
    SchedulerConfig,
    StorageConfig,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
_ROW = re.compile(r"^\| `(?P<key>[a-z_.]+)` \| (?P<unit>.*?) \| `(?P<default>.*?)` \| "
                  r"`(?P<env>[A-Z_]+)` \| (?P<doc>.*) \|$")


def _doc_rows() -> dict[str, dict[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(BEGIN):text.index(END)]
    return {m["key"]: m.groupdict() for line in section.splitlines()
            if (m := _ROW.match(line))}


def test_generated_section_is_current() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert render_section() in text, ("docs/config.md is stale: run "
                                      "python -m dualpath_cli.config.docs docs/config.md")


def test_docs_list_every_key_with_its_unit_default_and_env_var() -> None:
    rows = _doc_rows()
    assert list(rows) == [key.path for key in KEYS]
    for key in KEYS:
        row = rows[key.path]
        assert row["default"] == default_text(key)
        assert row["unit"].replace("\\|", "|") == key.kind.unit
        assert row["env"] == key.env_var


def test_docs_name_every_preset() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in PRESETS:
        assert f"| `{name}` |" in text


def test_schema_and_typed_model_have_the_same_keys() -> None:
    sections = {"cluster": ClusterConfig, "hardware": HardwareConfig, "model": ModelConfig,
                "storage": StorageConfig, "scheduler": SchedulerConfig}
    for section, cls in sections.items():
        fields = [f.name for f in dataclasses.fields(cls)]
        assert fields == [k.name for k in KEYS if k.section == section], section
