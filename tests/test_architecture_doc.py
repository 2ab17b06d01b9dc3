"""The counts and facts docs/architecture.md states are checked against the tree, so they
cannot go stale: when one of these fails, update the page (or the code), not the test."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

from dualpath_cli.telemetry.metrics import METRICS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def _stated(pattern: str) -> int:
    found = re.findall(pattern, DOC.read_text(encoding="utf-8"))
    assert len(found) == 1, f"docs/architecture.md should state this once: {pattern}"
    return int(found[0].replace(",", ""))


def test_the_test_file_count() -> None:
    actual = len(list((ROOT / "tests").rglob("test_*.py")))
    assert _stated(r"\*\*tests/\*\* has ([0-9,]+) pytest files") == actual


def test_the_metric_row_count() -> None:
    assert _stated(r"is the single table: ([0-9,]+) rows") == len(METRICS)


def test_the_wire_kinds() -> None:
    from dualpath_cli.runtime.wire import KINDS

    assert _stated(r"scheduler and engines \(([0-9]+) kinds: ") == len(KINDS)
    listed = re.search(r"\([0-9]+ kinds: ([^)]+)\)", DOC.read_text(encoding="utf-8"))
    assert listed is not None
    assert {k.strip() for k in listed[1].replace("\n", " ").split(",")} == set(KINDS)


def test_the_layer_contracts_listed_are_the_ones_checked() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Layers\n"):text.index("## Packages\n")]
    listed = [" ".join(m.split()) for m in re.findall(r"^- \*\*(.+?)\*\*", section, re.M | re.S)]
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    checked = [c["name"] for c in config["tool"]["importlinter"]["contracts"]]
    assert [name.rstrip(".") for name in listed] == checked


def test_planned_items_are_not_built() -> None:
    text = DOC.read_text(encoding="utf-8")
    planned = text[text.index("## Planned, not built"):]
    if (ROOT / "dualpath_cli" / "runtime" / "checkpoint.py").exists():
        assert "restartable scheduler" not in planned


def test_no_dependency_is_called_missing() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    names = {re.split(r"[<>=!;\[ ]", d, maxsplit=1)[0].lower()
             for d in deps["project"]["dependencies"]}
    claim = re.compile(r"([\w.-]+)(?:,? and ([\w.-]+))? (?:is|are) not (?:a )?dependenc", re.I)
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for match in claim.finditer(doc.read_text(encoding="utf-8").replace("`", "")):
            said = {n.lower() for n in match.groups() if n}
            assert not said & names, f"{doc.name}: {match[0]!r}, but pyproject lists it"
