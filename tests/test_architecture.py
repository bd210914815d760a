"""Layering rules, written down as tests (torchrec's test_code_quality habit).

- ``features/`` is the contract: it imports neither torch nor Apache Beam nor
  Feast, so every process can load it cheaply.
- ``pipelines/`` and ``trainer/`` never import each other; both stand on
  ``features/``.
- Production code never imports test code.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("features", "pipelines", "trainer")


def _modules(package: str) -> list[str]:
    return [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "__main__.py"
    ]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_features_imports_no_heavy_frameworks() -> None:
    modules = [m.removesuffix(".__init__") for m in _modules("features")]
    script = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    loaded = {name.split(".")[0] for name in json.loads(out)}
    assert not loaded & {"torch", "apache_beam", "feast", "torchrec", "fbgemm_gpu"}


@pytest.mark.parametrize(
    ("package", "forbidden"), [("pipelines", "trainer"), ("trainer", "pipelines")]
)
def test_pipelines_and_trainer_do_not_import_each_other(
    package: str, forbidden: str
) -> None:
    offenders = {
        str(path.relative_to(ROOT))
        for path in (ROOT / package).rglob("*.py")
        if any(name.split(".")[0] == forbidden for name in _imports(path))
    }
    assert not offenders


def test_production_code_does_not_import_tests() -> None:
    offenders = {
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if any(name.split(".")[0] == "tests" for name in _imports(path))
    }
    assert not offenders
