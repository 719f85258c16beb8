"""The image and the wheel carry every package: a package the Dockerfile does not copy makes
`pip install .` in the image fail (fleetbus and fleetledger_hook once were missing)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _packages() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {p.split(".")[0] for p in config["tool"]["setuptools"]["packages"]}


def test_the_dockerfile_copies_every_top_level_package_of_the_wheel() -> None:
    copied = set(re.findall(r"^COPY\s+(\S+)\s+\./\1\s*$", (ROOT / "Dockerfile").read_text(), re.M))
    assert _packages() - copied == set()


def test_every_package_directory_of_the_tree_is_in_the_wheel() -> None:
    on_disk = {
        p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name not in {"tests", "bench"}
    }
    assert on_disk - _packages() == set()


def test_every_subpackage_of_the_tree_is_in_the_wheel() -> None:
    """setuptools' explicit ``packages`` list takes no subpackage by itself: one left out is
    missing from the wheel (the editable install still finds it, so only this notices)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    top = _packages()
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in ROOT.glob("*/**/__init__.py")
        if p.parent.relative_to(ROOT).parts[0] in top
    }
    assert on_disk - listed == set()
