"""The embedding tables of a model and the optimizers that train them.

One Adam trains the dense parameters in every strategy
(:mod:`trainer.distributed.sharding`); the tables train with Adam too
(``embedding_optimizer="adam"``, replicated only, one Adam over everything),
or with exact Adagrad or SGD, which the model-parallel tables run inside
fbgemm's fused backward. Adagrad's running sums are kept by parameter name,
so a checkpoint carries them whatever the world size.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

import torch
from torch import nn

EmbeddingOptimizer = Literal["adam", "adagrad", "sgd"]
EMBEDDING_OPTIMIZERS: Final = ("auto", "adam", "adagrad", "sgd")
ADAGRAD_EPS: Final = 1e-8  # as Adam's; given to torch Adagrad and fbgemm alike


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """Optimizers of one run.

    Args:
        lr: Adam learning rate of the dense parameters.
        embedding_optimizer: optimizer of the embedding tables; ``adam``
            means one Adam over everything (replicated only).
        embedding_lr: learning rate of the tables (``None``: ``lr``).
    """

    lr: float = 1e-3
    embedding_optimizer: EmbeddingOptimizer = "adam"
    embedding_lr: float | None = None

    @property
    def table_lr(self) -> float:
        """The tables' learning rate."""
        return self.lr if self.embedding_lr is None else self.embedding_lr


def resolve_embedding_optimizer(name: str, sharding: str) -> EmbeddingOptimizer:
    """``auto`` → ``adam`` when replicated, ``adagrad`` when sharded.

    Example:
        >>> resolve_embedding_optimizer("auto", "model-parallel")
        'adagrad'
    """
    if name == "auto":
        return "adagrad" if sharding == "model-parallel" else "adam"
    if name == "adam" and sharding == "model-parallel":
        raise ValueError(
            "model-parallel tables train with fbgemm's fused optimizer, which "
            "has no Adam on CPU (and a lazy one, rows in the batch only, on "
            "GPU): use --embedding-optimizer adagrad or sgd"
        )
    if name not in EMBEDDING_OPTIMIZERS:
        raise ValueError(f"unknown embedding optimizer {name!r}")
    return name  # type: ignore[return-value]


def table_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(path, module) of every ``EmbeddingBagCollection`` / ``EmbeddingCollection``."""
    from torchrec.modules.embedding_modules import (
        EmbeddingBagCollection,
        EmbeddingCollection,
    )

    for name, module in model.named_modules():
        if isinstance(module, (EmbeddingBagCollection, EmbeddingCollection)):
            yield name, module


def table_parameter_names(model: nn.Module) -> set[str]:
    """Fully qualified names of every embedding-table weight of ``model``."""
    names = set()
    for path, module in table_modules(model):
        names |= {f"{path}.{n}" for n, _ in module.named_parameters()}
    return names


def table_optimizer(
    params: list[nn.Parameter], config: OptimizerConfig
) -> torch.optim.Optimizer | None:
    """Adagrad or SGD over ``params`` at the tables' rate; None for no params."""
    if not params:
        return None
    if config.embedding_optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=config.table_lr, eps=ADAGRAD_EPS)
    return torch.optim.SGD(params, lr=config.table_lr)


def named_sum_state(
    optimizer: torch.optim.Optimizer | None, names: dict[int, str]
) -> dict[str, torch.Tensor]:
    """Adagrad's ``sum`` per parameter name (SGD has no state)."""
    if optimizer is None:
        return {}
    return {
        names[id(p)]: state["sum"]
        for p, state in optimizer.state.items()
        if "sum" in state
    }


def load_sum_state(
    optimizer: torch.optim.Optimizer | None,
    params: dict[str, nn.Parameter],
    sums: dict[str, torch.Tensor],
) -> None:
    """Copy :func:`named_sum_state`'s sums back into an Adagrad's state."""
    if optimizer is None or not isinstance(optimizer, torch.optim.Adagrad):
        return
    for name, p in params.items():
        if name in sums:
            optimizer.state[p]["sum"].copy_(sums[name])


def check_optimizer(state: dict[str, Any], expected: str) -> None:
    """Refuse a checkpoint whose tables were trained by another optimizer."""
    saved = state.get("embedding_optimizer", "adam")
    if saved != expected:
        raise ValueError(
            f"the checkpoint's tables were trained with {saved!r}, this run uses "
            f"{expected!r}: pass --embedding-optimizer {saved}"
        )
