"""Where the parameters live: replicated on every rank, or tables model-parallel.

Two strategies with one interface (:class:`Replicated`, :class:`ModelParallel`),
so the daemon's loop does not care which one runs:

- ``replicated`` (:mod:`trainer.distributed.replicated`): every rank holds
  the whole model; each step all-reduces the example-weighted gradients of
  every parameter (one process needs no communication at all).
- ``model-parallel`` (:mod:`trainer.distributed.model_parallel`): TorchRec's
  ``DistributedModelParallel`` shards the big embedding tables table-wise;
  the small pooled tables and the dense part stay replicated, their
  gradients all-reduced example-weighted as in ``replicated``.

Checkpoints are world-size independent: ``full_state`` gathers every sharded
table and its optimizer state to full tensors on rank 0, under the same names
an unsharded model has, and ``load_full_state`` copies each rank's slice
back. So a checkpoint restores on any world size, in either strategy (when
the table optimizers agree), and loads with ``weights_only=True``.
"""

from __future__ import annotations

import torch

from trainer.distributed.model_parallel import DEFAULT_MIN_ROWS, ModelParallel
from trainer.distributed.replicated import Replicated
from trainer.distributed.strategy import SHARDINGS
from trainer.distributed.tables import OptimizerConfig
from trainer.models.loss_wrapper import GEMTrain


def build_strategy(
    model: GEMTrain,
    sharding: str,
    config: OptimizerConfig,
    device: torch.device,
    min_rows: int = DEFAULT_MIN_ROWS,
) -> Replicated | ModelParallel:
    """The strategy called ``sharding`` (``replicated`` or ``model-parallel``)."""
    if sharding == "replicated":
        return Replicated(model.to(device), config)
    if sharding == "model-parallel":
        return ModelParallel(model, config, device, min_rows)
    raise ValueError(f"unknown sharding {sharding!r}; choose from {SHARDINGS}")
