"""docs/benchmarks.md's tables are generated from bench/results/*.json and must match them;
docs/ and bench/ describe what things are, not how they were reached (that is git history)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"


@pytest.fixture(scope="module")
def render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_render_results",
                                                  ROOT / "bench" / "render_results.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_benchmarks_doc_matches_the_results_files(render: ModuleType) -> None:
    text = DOC.read_text(encoding="utf-8")
    assert render.render_doc(text, render.load_results()) == text, (
        f"docs/benchmarks.md is stale: run `{render.REGENERATE}`")


def test_every_results_file_has_a_section_and_a_how_block(render: ModuleType) -> None:
    names = render.marked_names(DOC.read_text(encoding="utf-8"))
    assert len(names) == len(set(names))
    for name, results in render.load_results().items():
        assert name in names, f"bench/results/{name}.json has no block in docs/benchmarks.md"
        assert {"machine", "command", "date"} <= set(results["how"]), name
    for name in render.GOALS:
        assert name in names, f"GOALS names {name}, which the page does not show"


def test_goals_name_keys_the_results_hold(render: ModuleType) -> None:
    for name, results in render.load_results().items():
        for key in render.GOALS.get(name, {}):
            value: object = results
            for part in key.split("."):
                assert isinstance(value, dict) and part in value, f"{name}: no {key}"
                value = value[part]


def test_a_block_is_rendered_from_its_file(render: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "demo.json").write_text(json.dumps({
        "cores": 0.5, "rows": [{"a": 1, "b": True}],
        "how": {"machine": "m", "command": "python bench/demo.py --json", "date": "d"}}))
    text = "x\n<!-- results: demo -->\nold\n<!-- end results: demo -->\ny\n"
    out = render.render_doc(text, render.load_results(tmp_path))
    assert "old" not in out and "| `cores` | 0.5 |" in out and "| 1 | yes |" in out
    assert "`python bench/demo.py --json`" in out and out.startswith("x\n") and out.endswith("y\n")
    assert "Not measured on this machine." in render.render_doc(text, {})


# a lab diary's marks: "session 12", and commit hashes given as such ("at 3cc3856",
# "(c9c9f70)"); hex in examples (block keys, Ray node ids) is not in these forms
_DIARY = re.compile(r"\bsessions? [0-9]+\b|(?:\bat |\bbefore |\bafter |\(|\bof |\bsince )"
                    r"[0-9a-f]{7,40}\b", re.I)


def _texts() -> list[Path]:
    return sorted([*(ROOT / "docs").rglob("*.md"), *(ROOT / "bench").rglob("*.py"),
                   *(ROOT / "bench").rglob("*.json")])


def test_no_diary_in_docs_or_bench() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in _texts()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bsessions? [0-9]+\b", line, re.I)]
    assert not found, "history belongs in git, not docs/ or bench/:\n" + "\n".join(found)


def test_no_commit_hashes_in_docs_or_bench() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in _texts()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if _DIARY.search(line) and not re.search(r"\bsessions? [0-9]+\b", line, re.I)]
    assert not found, "commit hashes belong in git, not docs/ or bench/:\n" + "\n".join(found)
