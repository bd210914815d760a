"""The replicated strategy: every rank holds the whole model.

Each step all-reduces the example-weighted gradients of every parameter
(one process needs no communication at all). The tables train with the
dense part's Adam, or with their own Adagrad or SGD
(:mod:`trainer.distributed.tables`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.data.batch import Batch
from trainer.distributed.strategy import Sharding, Stepped, weighted_allreduce
from trainer.distributed.tables import (
    OptimizerConfig,
    check_optimizer,
    load_sum_state,
    named_sum_state,
    table_optimizer,
    table_parameter_names,
)
from trainer.models.loss_wrapper import GEMTrain
from trainer.training.optimizers import adam
from trainer.training.step import train_step


class Replicated:
    """Every rank holds everything (module docstring).

    Args:
        model: the model, already on its device.
        config: optimizers.
    """

    sharding: Sharding = "replicated"

    def __init__(self, model: GEMTrain, config: OptimizerConfig) -> None:
        self.model = model
        self.config = config
        self._names = {id(p): n for n, p in model.named_parameters()}
        if config.embedding_optimizer == "adam":
            # One Adam over everything, tables included.
            self.optimizer = adam(model.parameters(), lr=config.lr)
            self.table_optimizer = None
            self._params = [p for p in model.parameters() if p.requires_grad]
            return
        tables = table_parameter_names(model)
        dense = [p for n, p in model.named_parameters() if n not in tables]
        self._tables = {n: p for n, p in model.named_parameters() if n in tables}
        self.optimizer = adam(dense, lr=config.lr)
        self.table_optimizer = table_optimizer(list(self._tables.values()), config)
        self._params = [p for p in model.parameters() if p.requires_grad]

    def step(self, batch: Batch, examples: int, total_examples: int) -> Stepped:
        """Forward, backward, example-weighted all-reduce, optimizer steps."""
        single = not dist.is_initialized() or dist.get_world_size() == 1
        if single and self.table_optimizer is None:
            out = train_step(self.model, batch, self.optimizer)
            return Stepped(out.loss, out.logits)
        self.optimizer.zero_grad(set_to_none=False)
        if self.table_optimizer is not None:
            self.table_optimizer.zero_grad(set_to_none=False)
        loss, logits = torch.zeros(()), None
        if examples:
            self.model.train()
            loss, outputs = self.model(batch)
            logits = outputs.logits.detach()
            (loss * examples).backward()  # example-weighted: Σ_r n_r g_r / N
        weighted_allreduce(self._params, total_examples)
        self.optimizer.step()
        if self.table_optimizer is not None:
            self.table_optimizer.step()
        return Stepped(loss.detach(), logits)

    def full_state(self) -> dict[str, Any]:
        """``model``, ``optimizer`` (Adam's own format) and the tables' state."""
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "embedding_optimizer": self.config.embedding_optimizer,
        }
        if self.table_optimizer is not None:
            state["table_optimizer_state"] = named_sum_state(
                self.table_optimizer, self._names
            )
        return state

    def load_full_state(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint written by either strategy."""
        check_optimizer(state, self.config.embedding_optimizer)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.table_optimizer is not None:
            load_sum_state(
                self.table_optimizer,
                self._tables,
                state.get("table_optimizer_state", {}),
            )

    def replicated_parameters(self) -> list[nn.Parameter]:
        """All of them."""
        return list(self.model.parameters())

    def replicated_state(self) -> list[torch.Tensor]:
        """The whole state dict."""
        return list(self.model.state_dict().values())
