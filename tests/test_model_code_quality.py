"""Architecture rules for the model code, as tests (torchrec's test_code_quality).

- Every public ``nn.Module`` in ``trainer.modules`` / ``trainer.models`` has a
  docstring with ``Args:`` and an ``Example``, and a constructor of at most 5
  arguments (or a single config dataclass).
- Every docstring example in the model code runs (``doctest``), since
  ``--doctest-modules`` only covers ``features/``.
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest
from torch import nn

import trainer.models
import trainer.modules
import trainer.ops

MAX_NUM_ARGS_IN_MODULE_CTOR = 5
MODEL_CODE = ["trainer.models.config", "trainer.training.step"] + [
    info.name
    for package in (trainer.ops, trainer.modules, trainer.models)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
]


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def _public_modules() -> list[type[nn.Module]]:
    found = []
    for name in MODEL_CODE:
        for _, cls in inspect.getmembers(_module(name), inspect.isclass):
            if (
                issubclass(cls, nn.Module)
                and cls.__module__ == name
                and not cls.__name__.startswith("_")
            ):
                found.append(cls)
    return found


PUBLIC_MODULES = _public_modules()


def test_the_model_code_has_modules() -> None:
    names = {cls.__name__ for cls in PUBLIC_MODULES}
    assert {"GEM", "Wukong", "InterFormer", "PyramidEncoder", "DCNv2"} <= names


@pytest.mark.parametrize("cls", PUBLIC_MODULES, ids=lambda c: c.__name__)
def test_public_module_docstring_and_ctor(cls: type[nn.Module]) -> None:
    doc = inspect.getdoc(cls) or ""
    assert "Example" in doc, f"{cls.__name__} has no Example"
    assert "Args:" in doc, f"{cls.__name__} documents no Args"
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    single_config = len(params) == 1 and (
        params[0].name == "config"
        or dataclasses.is_dataclass(params[0].annotation)
        or "Config" in str(params[0].annotation)
    )
    assert single_config or len(params) <= MAX_NUM_ARGS_IN_MODULE_CTOR, cls.__name__


@pytest.mark.parametrize("name", MODEL_CODE)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
