"""Layering rules, written down as tests (torchrec's test_code_quality habit).

- ``features/`` is the contract: it imports neither torch nor Apache Beam nor
  Feast, so every process can load it cheaply.
- ``pipelines/`` and ``trainer/`` never import or start each other; both stand
  on ``features/``. ``serving/`` imports and starts neither: it reads the
  artifacts the trainer exports and the online store the pipelines fill.
  Only ``demos/`` knows both wings, and nothing imports it.
- The batch and streaming jobs share ``pipelines.beam`` and ``pipelines.core``
  but not each other's stages; ``pipelines.core`` imports no Beam.
- No import circles between the project's modules.
- A module stays under :data:`MAX_MODULE_LINES` lines and a function under
  :data:`MAX_FUNCTION_LINES`, outside tests and benchmarks: past that, a
  reader cannot hold it in mind (docs/architecture.md).
- Production code never imports test code.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tests.interpreter import run_python

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("features", "pipelines", "trainer", "serving", "demos", "launchers")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100


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


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(
        ".__init__"
    )


def _project_files() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, function-level imports
    included; ``from a import b`` counts ``a.b`` alone when that is a module."""
    files = _project_files()
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in files else node.module)
        graph[name] = {target for target in targets if target in files} - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    graph = _import_graph()
    assert graph["pipelines.build"], "the graph must see the project's imports"
    assert _circles(graph) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]
    ]


def test_only_tests_import_the_demos() -> None:
    offenders = {
        name
        for name, targets in _import_graph().items()
        if not name.startswith("demos")
        and any(t.split(".")[0] == "demos" for t in targets)
    }
    assert not offenders


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("pipelines", "trainer"),
        ("trainer", "pipelines"),
        ("serving", "trainer"),
        ("serving", "pipelines"),
    ],
)
def test_pipelines_and_trainer_do_not_start_each_other(
    package: str, forbidden: str
) -> None:
    """No ``python -m <other wing>...`` in code: a string naming one of the
    other wing's modules, outside docstrings, is how a command line starts it."""
    module = re.compile(rf"{forbidden}(\.\w+)+")
    offenders = set()
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            )
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        offenders.update(
            f"{path.relative_to(ROOT)}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and module.fullmatch(node.value)
        )
    assert not offenders


def test_modules_stay_short() -> None:
    long_modules = {
        str(path.relative_to(ROOT)): lines
        for path in _project_files().values()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long_modules == {}


def test_functions_stay_short() -> None:
    long_functions = {}
    for path in _project_files().values():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert long_functions == {}


def test_features_imports_no_heavy_frameworks() -> None:
    modules = [m.removesuffix(".__init__") for m in _modules("features")]
    script = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = run_python(script, check=True).stdout
    loaded = {name.split(".")[0] for name in json.loads(out)}
    assert not loaded & {"torch", "apache_beam", "feast", "torchrec", "fbgemm_gpu"}


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("pipelines", "trainer"),
        ("trainer", "pipelines"),
        ("serving", "trainer"),
        ("serving", "pipelines"),
        ("serving", "demos"),
        ("pipelines", "serving"),
        ("trainer", "serving"),
        # The two Beam jobs share pipelines.beam and pipelines.core, not
        # each other's stages; the kernels run without Beam.
        ("pipelines/batch", "pipelines.streaming"),
        ("pipelines/streaming", "pipelines.batch"),
        ("pipelines/core", "apache_beam"),
        ("pipelines/core", "pipelines.batch"),
        ("pipelines/core", "pipelines.streaming"),
    ],
)
def test_packages_do_not_import_what_they_stand_beside(
    package: str, forbidden: str
) -> None:
    offenders = {
        str(path.relative_to(ROOT))
        for path in (ROOT / package).rglob("*.py")
        if any(
            name == forbidden or name.startswith(forbidden + ".")
            for name in _imports(path)
        )
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
