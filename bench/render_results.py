"""Render the result tables of docs/benchmarks.md from bench/results/*.json.

Each benchmark's current figures live in one JSON file, ``bench/results/NAME.json``: the
keys its ``--json`` prints (the ones the page reports) plus a ``how`` block (``machine``,
``command``, ``date`` and an optional ``note``). In docs/benchmarks.md a benchmark's table
sits between two markers::

    <!-- results: NAME -->
    ... generated ...
    <!-- end results: NAME -->

Everything outside the markers is written by hand (what the benchmark measures, why, its
command). Usage::

    python bench/render_results.py            # rewrite the tables in docs/benchmarks.md
    python bench/render_results.py --check    # exit 1 if the page differs from the files

tests/test_benchmarks_docs.py fails when the page and the files disagree. To update a
benchmark's figures, replace its JSON file's keys with a new ``--json`` run's (and its
``how``), then rewrite the page.
"""

from __future__ import annotations

import json
import operator
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
REGENERATE = "python bench/render_results.py"

_BLOCK = re.compile(r"(<!-- results: (?P<name>[a-z0-9_]+) -->\n)(?P<body>.*?)"
                    r"(<!-- end results: (?P=name) -->)", re.S)

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq}

# The issues' goals, by benchmark and key (a dotted path into the JSON): "< 1" reads
# "the value is under 1". A key without a goal is reported only.
GOALS: dict[str, dict[str, str]] = {
    "scheduler": {"median_us": "< 20"},
    "control_plane": {"sched_cpu_cores_48p96d.value": "< 1"},
    "control_plane_inproc": {"sched_cpu_inproc_48p96d.total_cores_at_paper_rate": "< 1"},
    "control_plane_join": {"join_to_serving_s": "< 2", "death_to_requeue_s": "< 2"},
    "runtime": {"basic_over_dualpath.min": ">= 1.8", "dualpath_over_oracle.max": "<= 1.2",
                "goals_met": "yes"},
    "sim_speed": {"turns_per_s": "> 8000", "wall_s": "< 900"},
    "sim_speed_core": {"compiled_turns_per_s": ">= 50000"},
    "warm": {"serving.kept": ">= 0.9", "cap_held": "yes"},
    "metrics_render": {"metrics_render_ms_1152": "<= 50", "api_metrics_render_ms_1152": "<= 50"},
    "api": {"overhead_p50_ms": "<= 2", "stream_first_chunk_ratio": "<= 0.3", "ready_s": "<= 5",
            "metrics_render_ms_1152": "<= 50", "api_metrics_render_ms_1152": "<= 50",
            "errors": "== 0"},
    "launch": {"ready_s.median": "<= 5"},
    "cli_start": {"version_s": "< 0.3", "help_s": "< 0.3"},
    "monitor": {"diagnose_s_1152": "< 5", "monitor_cpu_pct": "< 2"},
    "diagnose_stability": {"passed": "yes"},
    "drill": {"goal_met": "yes"},
    "drill_joined": {"goal_met": "yes"},
    "tui": {"frame_ms_1152": "< 100", "idle_cpu_pct": "< 5"},
    "tune_suggest": {"embedded.suggest_s": "< 60", "embedded_with_stories.suggest_s": "< 60",
                     "ds660b.suggest_s": "< 60"},
    "twin_check": {"agree_within_15pct": "yes"},
    "trace_agreement": {"jct_within_goal": "yes", "hits_within_goal": "yes"},
    "twin_mooncake": {"within_band": "yes"},
    "trace_hits": {"worst_gap_points": "< 1", "hits_within_goal": "yes"},
}


def load_results(directory: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every results file, by benchmark name (the file's stem)."""
    return {p.stem: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(directory.glob("*.json"))}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.6g}" if abs(value) >= 1000 else f"{value:.6g}"
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    return str(value).replace("|", "\\|")


def _is_table(value: Any) -> bool:
    """A list of records, or records by name (a dict of two or more dicts of scalars)."""
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, dict) for v in value)
    return (isinstance(value, dict) and len(value) >= 2 and all(
        isinstance(v, dict) and not any(isinstance(x, (dict, list)) for x in v.values())
        for v in value.values()))


def _records(value: list[dict[str, Any]] | dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(value, list):
        return value
    return [{"": name, **fields} for name, fields in value.items()]


def _scalars(data: dict[str, Any], goals: set[str], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every value not shown as a table, depth first in file order.

    Records with a goal on one of their fields stay keys, so that the goal has a row.
    """
    for key, value in data.items():
        path = f"{prefix}{key}"
        if _is_table(value) and not any(g.startswith(f"{path}.") for g in goals):
            continue
        if isinstance(value, dict):
            yield from _scalars(value, goals, f"{path}.")
        elif not _is_table(value):
            yield path, value


def _tables(data: dict[str, Any], goals: set[str],
            prefix: str = "") -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(dotted key, records) of every table, in file order."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        if _is_table(value) and not any(g.startswith(f"{path}.") for g in goals):
            yield path, _records(value)
        elif isinstance(value, dict):
            yield from _tables(value, goals, f"{path}.")


def _met(goal: str, value: Any) -> str:
    if goal == "yes":
        return _fmt(value) if isinstance(value, bool) else ""
    match = re.fullmatch(r"(<=|>=|<|>|==) (-?[0-9.]+)", goal)
    if match is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return ""
    return "yes" if _COMPARE[match[1]](value, float(match[2])) else "no"


def _key_table(name: str, data: dict[str, Any]) -> list[str]:
    goals = GOALS.get(name, {})
    rows = list(_scalars(data, set(goals)))
    if not rows:
        return []
    if not goals:
        lines = ["| key | value |", "|---|---:|"]
        return lines + [f"| `{key}` | {_fmt(value)} |" for key, value in rows]
    lines = ["| key | value | goal | met |", "|---|---:|---|---|"]
    for key, value in rows:
        goal = goals.get(key, "")
        lines.append(f"| `{key}` | {_fmt(value)} | {_fmt(goal) if goal else ''} | "
                     f"{_met(goal, value) if goal else ''} |")
    return lines


def _row_table(rows: list[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    lines = ["| " + " | ".join(f"`{c}`" if c else "" for c in columns) + " |",
             "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |" for row in rows]


def render_block(name: str, results: dict[str, Any]) -> str:
    """The generated text of one benchmark: its keys, its row tables, how it was measured."""
    data = {k: v for k, v in results.items() if k != "how"}
    lines = _key_table(name, data)
    for key, rows in _tables(data, set(GOALS.get(name, {}))):
        lines += ["", f"`{key}`:", ""] + _row_table(rows)
    how = results.get("how", {})
    lines += ["", f"Measured {how.get('date', '(date not recorded)')} on "
              f"{how.get('machine', '(machine not recorded)')}: `{how.get('command', '')}`."]
    if how.get("note"):
        lines.append(f"{how['note']}")
    lines.append(f"Figures: `bench/results/{name}.json`.")
    return "\n".join(lines) + "\n"


def render_doc(text: str, results: dict[str, dict[str, Any]]) -> str:
    """``text`` with every marked block replaced by its results file's tables.

    A marker whose results file is missing says so in place of a table.
    """
    def block(match: re.Match[str]) -> str:
        name = match["name"]
        body = (render_block(name, results[name]) if name in results
                else "Not measured on this machine.\n")
        return f"{match[1]}\n{body}\n{match[4]}"
    return _BLOCK.sub(block, text)


def marked_names(text: str) -> list[str]:
    """The benchmarks the page has a results block for, in page order."""
    return [m["name"] for m in _BLOCK.finditer(text)]


def main(argv: list[str]) -> int:
    text = DOC.read_text(encoding="utf-8")
    rendered = render_doc(text, load_results())
    if "--check" in argv:
        if rendered != text:
            print(f"stale: docs/benchmarks.md; run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(rendered, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
