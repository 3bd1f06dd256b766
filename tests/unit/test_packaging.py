"""The wheel ships the product only, and the package admits newer torch releases.

``pip wheel .`` takes its packages from ``[tool.setuptools.packages.find]``; this runs the same
finder on the same configuration (building a real wheel needs a build backend fetched from the
package index, which a unit test should not do)."""

from __future__ import annotations

from pathlib import Path

import tomllib
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_wheel_holds_the_product_and_no_benchmark_code():
    found = find_packages(where=str(ROOT), **PYPROJECT["tool"]["setuptools"]["packages"]["find"])
    assert "tmslurm" in found and {"tmslurm.wire", "tmslurm.agent", "tmslurm.controller", "tmslurm.slurm.proc"} <= set(
        found
    )
    assert [p for p in found if not p.startswith("tmslurm")] == []
    assert (ROOT / "benchmarks" / "__main__.py").exists()  # the benchmarks live beside the package


def test_torch_has_no_upper_bound():
    torch = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch")]
    assert torch and all("<" not in d for d in torch), torch


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by basename (rootdir-relative, no packages): two test_x.py in
    different folders stop the whole collection ("import file mismatch")."""
    root = Path(__file__).resolve().parents[1]
    names = [p.name for p in root.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
