"""What ``pip install .[pipelines]`` brings, worked out without a network:
the requirement closure of the base dependencies and the ``pipelines``
extra over the distributions installed here (each one's own requirements,
markers evaluated as pip evaluates them). A Beam worker gets everything the
feature jobs import and no PyTorch; the trainer's extra is where PyTorch is.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FIRST_PARTY = frozenset(
    {
        "features",
        "pipelines",
        "serving",
        "trainer",
        "launchers",
        "demos",
        "feature_repo",
    }
)
# feature_repo's files import each other by bare name, as `feast apply` loads them.
REPO_MODULES = frozenset(path.stem for path in (ROOT / "feature_repo").glob("*.py"))
NEVER_ON_A_WORKER = ("torch", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu", "triton")


def _applies(requirement: Requirement, extras: Iterable[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(
        requirement.marker.evaluate({**default_environment(), "extra": extra})
        for extra in ("", *extras)
    )


def closure(extras: Iterable[str]) -> set[str]:
    """Canonical names of every distribution ``pip install .[extras]`` would
    install, resolved over this environment's distributions."""
    wanted = list(extras)
    pending = [Requirement(text) for text in PROJECT["dependencies"]]
    for extra in wanted:
        pending += [Requirement(t) for t in PROJECT["optional-dependencies"][extra]]
    own = canonicalize_name(PROJECT["name"])
    found: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        if name == own:  # a self-reference: the project's own extras
            for extra in requirement.extras:
                pending += [
                    Requirement(t) for t in PROJECT["optional-dependencies"][extra]
                ]
            continue
        found.add(name)
        distribution = importlib.metadata.distribution(name)
        for text in distribution.requires or ():
            needed = Requirement(text)
            if _applies(needed, requirement.extras):
                pending.append(needed)
    return found


def third_party_imports(*folders: str) -> set[str]:
    """Top-level modules the files under ``folders`` import that are neither
    the standard library's nor the project's."""
    names: set[str] = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif (
                    isinstance(node, ast.ImportFrom) and node.module and not node.level
                ):
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - FIRST_PARTY - REPO_MODULES


def _distributions_of(modules: Iterable[str]) -> dict[str, set[str]]:
    by_module = importlib.metadata.packages_distributions()
    return {
        module: {canonicalize_name(d) for d in by_module.get(module, [])}
        for module in modules
    }


def test_a_beam_worker_installs_no_torch() -> None:
    worker = closure(["pipelines"])
    assert "apache-beam" in worker
    assert "feast" in worker
    assert "redis" in worker  # feast[redis]
    assert "psycopg" in worker  # feast[postgres]
    assert worker.isdisjoint(NEVER_ON_A_WORKER), worker & set(NEVER_ON_A_WORKER)
    assert not {name for name in worker if name.startswith("nvidia-")}


def test_the_contract_installs_neither_beam_nor_feast_nor_torch() -> None:
    base = closure([])
    assert {"pyarrow", "numpy", "kafka-python"} <= base
    assert base.isdisjoint({"apache-beam", "feast", *NEVER_ON_A_WORKER})


def test_every_module_the_feature_jobs_import_is_installed_with_them() -> None:
    worker = closure(["pipelines"])
    imports = third_party_imports("features", "pipelines", "feature_repo")
    assert {"apache_beam", "feast", "pyarrow", "kafka"} <= imports
    missing = {
        module: dists
        for module, dists in _distributions_of(imports).items()
        if not dists & worker
    }
    assert not missing, missing


def test_the_contract_s_imports_come_with_the_base() -> None:
    base = closure([])
    missing = {
        module: dists
        for module, dists in _distributions_of(third_party_imports("features")).items()
        if not dists & base
    }
    assert not missing, missing


def test_the_trainer_s_extra_has_what_it_imports() -> None:
    trainer = closure(["trainer"])
    assert {"torch", "fbgemm-gpu-cpu"} <= trainer
    # torchrec is installed --no-deps (requirements/README.md): not an extra.
    imports = third_party_imports("trainer", "launchers") - {"torchrec"}
    missing = {
        module: dists
        for module, dists in _distributions_of(imports).items()
        if not dists & trainer
    }
    assert not missing, missing
    assert "apache-beam" not in trainer


def test_the_serving_extra_has_what_the_server_imports() -> None:
    server = closure(["serving"])
    assert {"torch", "fastapi", "uvicorn", "feast"} <= server
    missing = {
        module: dists
        for module, dists in _distributions_of(
            third_party_imports("features", "serving")
        ).items()
        if not dists & server
    }
    assert not missing, missing
    assert "apache-beam" not in server


def test_a_built_wheel_carries_the_feature_repository(tmp_path: Path) -> None:
    """Built without a network (this environment's setuptools) and imported
    from outside any checkout: the job finds the packaged repository."""
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".*", "tests", "benchmarks", "docs", "data", "__pycache__", "*.egg-info"
        ),
    )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", str(source), "-w", str(wheels)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("*.whl")
    installed = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(installed)
    assert {"feature_repo/feature_store.yaml", "feature_repo/feature_store.prod.yaml",
            "feature_repo/sources.py"} <= names  # fmt: skip
    assert not {name for name in names if name.startswith("feature_repo/data")}
    found = subprocess.run(
        [sys.executable, "-c",
         "from features.feast_repository import feature_repo; print(feature_repo())"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert found.stdout.strip() == str(installed / "feature_repo")
