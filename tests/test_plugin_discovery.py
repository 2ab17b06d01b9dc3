"""plugins/discovery.py finds a group's entry points the way importlib.metadata does."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

from dualpath_cli.plugins.discovery import entry_points


def _dist(site: Path, dir_name: str, name: str, version: str, entry_points_txt: str) -> None:
    info = site / dir_name
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   "\nA long description: Name: not-this\n")
    (info / "entry_points.txt").write_text(entry_points_txt)


def test_finds_the_group_with_its_distribution_and_skips_others(tmp_path: Path) -> None:
    _dist(tmp_path, "my_plugin-1.2.dist-info", "my-plugin", "1.2",
          "[console_scripts]\nfoo = a:b\n\n[dualpath]\nmine = my_plugin.hooks\n"
          "# a comment\nother = my_plugin.more:obj.attr\n")
    _dist(tmp_path, "unrelated-0.1.dist-info", "unrelated", "0.1", "[other]\nx = y\n")
    found = entry_points("dualpath", [str(tmp_path)])
    assert [(e.name, e.value, e.dist_name, e.dist_version) for e in found] == [
        ("mine", "my_plugin.hooks", "my-plugin", "1.2"),
        ("other", "my_plugin.more:obj.attr", "my-plugin", "1.2")]


def test_the_first_copy_of_a_distribution_on_the_path_wins(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    _dist(first, "dup-2.0.dist-info", "dup", "2.0", "[dualpath]\nnew = dup.v2\n")
    _dist(second, "dup-1.0.dist-info", "dup", "1.0", "[dualpath]\nold = dup.v1\n")
    found = entry_points("dualpath", [str(first), str(second), str(tmp_path / "missing")])
    assert [(e.name, e.dist_version) for e in found] == [("new", "2.0")]


def test_load_follows_the_attribute_path(tmp_path: Path) -> None:
    pkg = tmp_path / "disc_pkg_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("class Holder:\n    value = 42\n")
    _dist(tmp_path, "disc_pkg_probe-0.1.dist-info", "disc-pkg-probe", "0.1",
          "[dualpath]\nprobe = disc_pkg_probe:Holder.value\n")
    sys.path.insert(0, str(tmp_path))
    try:
        (ep,) = entry_points("dualpath", [str(tmp_path)])
        assert ep.load() == 42
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("disc_pkg_probe", None)


def test_agrees_with_importlib_metadata_on_this_environment() -> None:
    for group in ("dualpath", "console_scripts", "pytest11"):
        ours = sorted((e.name, e.value) for e in entry_points(group))
        theirs = sorted((e.name, e.value) for e in importlib.metadata.entry_points(group=group))
        assert ours == theirs, group
