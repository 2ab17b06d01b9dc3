"""Find the installed distributions' entry points of one group, cheaply.

Why not ``importlib.metadata.entry_points(group=...)``: importing ``importlib.metadata``
(with its e-mail header parser) and letting it read every installed distribution costs
about 0.05 s, a sixth of the start-up budget of ``dualpath --help``, which must list
plugins' commands. Here each ``sys.path`` directory is listed once, only the
``entry_points.txt`` files that name the group are parsed, and only their distributions'
``METADATA`` is read (for the name and version ``plugins list`` shows).

The rules are importlib.metadata's: ``*.dist-info`` and ``*.egg-info`` directories on
``sys.path``, in path order; a distribution found twice counts once (the first wins).
Zipped paths (eggs, zipapps) are not searched.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FoundEntryPoint", "entry_points"]


@dataclass(frozen=True)
class FoundEntryPoint:
    """One ``name = module:attr`` line of a group, with its distribution."""

    name: str
    value: str
    group: str
    dist_name: str | None = None
    dist_version: str | None = None

    def load(self) -> object:
        """Import the module and follow the attribute path (``module:a.b``)."""
        module, _, attr = self.value.partition(":")
        obj: object = importlib.import_module(module.strip())
        for part in filter(None, attr.split("[")[0].strip().split(".")):
            obj = getattr(obj, part)
        return obj


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _metadata(info_dir: str) -> tuple[str | None, str | None]:
    """``Name`` and ``Version`` from the distribution's METADATA (or PKG-INFO) header."""
    name = version = None
    for file in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(info_dir, file), encoding="utf-8") as f:
                for line in f:
                    if not line.strip():
                        break  # the header ends at the first blank line
                    key, _, value = line.partition(":")
                    if key == "Name":
                        name = value.strip()
                    elif key == "Version":
                        version = value.strip()
                    if name and version:
                        break
            break
        except OSError:
            continue
    return name, version


def _lines_of_group(text: str, group: str) -> Iterable[tuple[str, str]]:
    """``(name, value)`` pairs of section ``[group]`` of an entry_points.txt."""
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1].strip() == group
            continue
        if inside and "=" in line:
            name, _, value = line.partition("=")
            yield name.strip(), value.strip()


def entry_points(group: str, path: Iterable[str] | None = None) -> list[FoundEntryPoint]:
    """Every entry point of ``group`` installed on ``path`` (default ``sys.path``)."""
    found: list[FoundEntryPoint] = []
    seen: set[str] = set()
    marker = f"[{group}]"
    for base in sys.path if path is None else path:
        try:
            entries = sorted(os.scandir(base or "."), key=lambda e: e.name)
        except OSError:
            continue  # not a directory (a zip), or gone
        for entry in entries:
            if not entry.name.endswith((".dist-info", ".egg-info")):
                continue
            stem = entry.name.rsplit(".", 1)[0]
            dir_name = _normalize(stem.split("-", 1)[0])
            if dir_name in seen:
                continue
            seen.add(dir_name)
            try:
                with open(os.path.join(entry.path, "entry_points.txt"),
                          encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue  # no entry points (or an egg-info file, not a directory)
            if marker not in text:
                continue
            name, version = _metadata(entry.path)
            for ep_name, value in _lines_of_group(text, group):
                found.append(FoundEntryPoint(ep_name, value, group, name, version))
    return found
