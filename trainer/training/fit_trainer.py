"""The offline trainer: a model on one device, its optimizer and its
learning-rate schedule, one :meth:`FitTrainer.step` per batch.

Optimizer: ``adam`` (default) is plain Adam on every parameter, the choice
that works on any CPU. ``adam+adagrad`` is the paper's split: Adam for dense
parameters, Adagrad for embedding tables (element-wise, since PyTorch has no
row-wise Adagrad). A table row that got no gradient is left untouched,
unlike under Adam, whose momentum keeps moving it; so the tables' gradients
are sparse, and a step costs the rows read, not the whole table
(``docs/decisions/0026-adagrad-tables-on-sparse-gradients.md`` compares the
two).

Every model's output gets a learnable (domain, objective) offset initialised
to given logits (:class:`BaseRateOffset`: the train base rates), so short
runs do not spend their steps learning the prior.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from trainer.data.batch import Batch
from trainer.models.base_rate import BaseRateOffset
from trainer.models.config import ModelConfig
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import build_model
from trainer.training.optimizers import adam
from trainer.training.run_config import FitConfig
from trainer.training.step import compile_model, train_step


def make_optimizer(model: nn.Module, cfg: FitConfig) -> torch.optim.Optimizer:
    """Adam for all, or Adam (dense) + Adagrad (embedding tables).

    Under ``adam+adagrad`` the tables of an eager ``model`` are switched to
    sparse gradients: Adagrad leaves a row without gradient as it is, so a
    gradient of the rows the batch read gives the same update as a dense one,
    without a table-sized gradient to zero, clip and step every batch. Under
    ``cfg.compile`` they stay dense: a compiled graph cannot produce a sparse
    gradient, whose size depends on the data.
    """
    if cfg.optimizer == "adam":
        return adam(model.parameters(), lr=cfg.lr)
    if cfg.optimizer != "adam+adagrad":
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}")
    tables = [
        m for m in model.modules() if isinstance(m, nn.Embedding | nn.EmbeddingBag)
    ]
    if cfg.compile is None:
        for table in tables:
            table.sparse = True
        # torch's default, made explicit so that it does not warn: Adagrad
        # builds its sparse tensors from coalesced gradients.
        torch.sparse.check_sparse_tensor_invariants.disable()
    table_weights = {id(p) for t in tables for p in t.parameters(recurse=False)}
    dense = [p for p in model.parameters() if id(p) not in table_weights]
    sparse = [p for p in model.parameters() if id(p) in table_weights]
    return _Combined(
        adam(dense, lr=cfg.lr),
        torch.optim.Adagrad(sparse, lr=cfg.embedding_lr),
    )


def lr_factor(schedule: str, step: int, total_steps: int) -> float:
    """The learning-rate multiplier at ``step`` (0-based) of ``total_steps``.

    ``cosine`` anneals from 1 to 0 over the whole run: late steps take small
    moves, so the per-epoch validation scores (and the epoch chosen by them)
    stop jumping with the last few noisy batches.

    Example:
        >>> lr_factor("constant", 9, 10), lr_factor("cosine", 0, 10)
        (1.0, 1.0)
        >>> round(lr_factor("cosine", 5, 10), 3)
        0.5
    """
    if schedule in ("constant", "plateau"):  # plateau: FitTrainer.rate_scale
        return 1.0
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))
    raise ValueError(f"unknown lr schedule {schedule!r}")


class _Combined(torch.optim.Optimizer):
    """Two optimizers stepped as one (what ``train_step`` expects)."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers
        groups = [g for o in optimizers for g in o.param_groups]
        super().__init__([{"params": []}], {})
        self.param_groups = groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> None:
        for o in self.optimizers:
            o.step()

    def load_parts(self, states: list[dict[str, Any]]) -> None:
        """Load each optimizer's state (as ``[o.state_dict() for o in
        optimizers]`` saved it)."""
        for optimizer, state in zip(self.optimizers, states, strict=True):
            optimizer.load_state_dict(state)
        # Loading replaces each optimizer's groups: the schedule sets these.
        self.param_groups = [g for o in self.optimizers for g in o.param_groups]


class FitTrainer:
    """A model, its optimizer and learning-rate schedule (module docstring).

    Args:
        cfg: the run (model, optimizer, learning rates, schedule, grad clip,
            ``compile``).
        config: the model's configuration.
        base_logits: (Dm, O) logits every output starts at.
        device: where it trains.
        autocast: the forward's autocast context.
        total_steps: the run's length, for the schedule.
    """

    def __init__(
        self,
        cfg: FitConfig,
        config: ModelConfig,
        base_logits: torch.Tensor,
        device: torch.device,
        autocast: torch.autocast,
        total_steps: int,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.autocast = autocast
        self.total_steps = total_steps
        self.model = GEMTrain(
            BaseRateOffset(build_model(cfg.model, config), base_logits)
        ).to(device)
        self.eager = self.model.model  # what a checkpoint holds: no compile names
        if cfg.compile is not None:
            # The loss and the optimizer stay eager; the model is the graph.
            self.model.model = compile_model(self.model.model, backend=cfg.compile)
        self.optimizer = make_optimizer(self.model, cfg)
        self._base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.steps = 0
        # What the plateau schedule halves: every rate is its base times this.
        self.rate_scale = 1.0

    def step(self, batch: Batch) -> torch.Tensor:
        """One step at the schedule's learning rate; its loss (on the device)."""
        factor = self.rate_scale * lr_factor(
            self.cfg.lr_schedule, self.steps, self.total_steps
        )
        for group, base_lr in zip(
            self.optimizer.param_groups, self._base_lrs, strict=True
        ):
            group["lr"] = base_lr * factor
        self.steps += 1
        with self.autocast:
            out = train_step(self.model, batch, self.optimizer, self.cfg.max_grad_norm)
        return out.loss

    def snapshot(self) -> dict[str, Any]:
        """A copy of the model's and the optimizer's state, where they are,
        for :meth:`restore` (the best epoch's, kept while later ones run)."""
        return copy.deepcopy(
            {"model": self.model.state_dict(), "optimizer": self._optimizer_state()}
        )

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Go back to a :meth:`snapshot` (the steps taken still count)."""
        self.model.load_state_dict(snapshot["model"])
        self._load_optimizer_state(copy.deepcopy(snapshot["optimizer"]))

    def _optimizer_state(self) -> Any:
        if isinstance(self.optimizer, _Combined):
            return [o.state_dict() for o in self.optimizer.optimizers]
        return self.optimizer.state_dict()

    def _load_optimizer_state(self, state: Any) -> None:
        if isinstance(self.optimizer, _Combined):
            self.optimizer.load_parts(state)
        else:
            self.optimizer.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        """The model (``GEMTrain``'s names, CPU copies, without compile's),
        the optimizer state and the steps taken: a checkpoint's body."""
        # CPU copies: the checkpoint loads the same on a machine without a GPU.
        model = {
            f"model.{k}": v.detach().cpu() for k, v in self.eager.state_dict().items()
        }
        return {
            "model": model,
            "optimizer": self._optimizer_state(),
            "step": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`'s output."""
        self.eager.load_state_dict(
            {k.removeprefix("model."): v for k, v in state["model"].items()}
        )
        self._load_optimizer_state(state["optimizer"])
        self.steps = int(state["step"])
