"""The daemon's trainer: GEM under its sharding strategy, its progressive
metrics and the run's counters, one :meth:`DaemonTrainer.step` per lockstep iteration.

Every output starts at a prior rate (:class:`BaseRateOffset`): progressive
validation scores from the very first batch, and a model at p = 0.5 would
spend its first steps (and ruin the lifetime metrics) just learning the base
rate. The step's forward, before its update, scores the batch for
progressive validation: the models have no train-only layers.

``--sharding replicated`` keeps one Adam over everything and needs no
process group in one process; ``model-parallel`` shards the embedding tables
with TorchRec (:mod:`trainer.distributed.sharding`), whose fused CPU kernel
has no Adam, so the tables train with Adagrad there. Either way the state is
full, unsharded tensors under the unsharded names (gathered to rank 0), so a
checkpoint restores on any world size.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.data.batch import Batch
from trainer.distributed.sharding import build_strategy
from trainer.distributed.tables import OptimizerConfig, resolve_embedding_optimizer
from trainer.metrics.progressive import ProgressiveMetrics
from trainer.models.base_rate import BaseRateOffset, prior_logits
from trainer.models.config import preset as preset_config
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import build_model, model_config
from trainer.training.ranks import Ranks
from trainer.training.run_config import DaemonConfig
from trainer.training.step import scored


class DaemonTrainer:
    """GEM, its optimizers, its progressive metrics and the run-wide counters.

    Args:
        config: the run (model, preset, optimizers, sharding, seed).
        ranks: this rank among the run's (its device; the collectives).

    The counters count the whole run across restarts: ``steps``,
    ``examples`` (all ranks'), ``records`` (every record applied, poison
    included) and ``dead_letters``.
    """

    def __init__(self, config: DaemonConfig, ranks: Ranks) -> None:
        self.config = config
        self.ranks = ranks
        self.model_config = model_config(config.model, preset_config(config.preset))
        torch.manual_seed(config.seed)
        model = GEMTrain(
            BaseRateOffset(
                build_model(config.model, config.preset),
                prior_logits(config.prior_click_rate, config.prior_conversion_rate),
            )
        )
        optimizers = OptimizerConfig(
            lr=config.lr,
            embedding_optimizer=resolve_embedding_optimizer(
                config.embedding_optimizer, config.sharding
            ),
            embedding_lr=config.embedding_lr,
        )
        self.strategy = build_strategy(
            model, config.sharding, optimizers, ranks.device, config.min_sharded_rows
        )
        self.metrics = ProgressiveMetrics(config.window_examples)
        self.steps = self.examples = self.records = self.dead_letters = 0
        self.loss = torch.zeros(())

    def step(self, batch: Batch | None, examples: int, total: int) -> None:
        """One step on every rank: this rank's ``batch`` weighs ``examples``
        of the ``total`` over all ranks (0 for a stand-in, or no batch)."""
        result = self.strategy.step(batch, examples, total)  # type: ignore[arg-type]
        self.loss = result.loss
        if batch is not None and examples and result.logits is not None:
            self.metrics.update(scored(result.logits, batch))
        self.steps += 1
        self.examples += total

    def take(self, applied: bool) -> None:
        """Count one record taken by some rank (``applied``: not poison)."""
        self.records += 1
        if not applied:
            self.dead_letters += 1

    def checksums(self) -> torch.Tensor:
        """Two sums of the replicated parameters: equal on every rank."""
        flat = torch.cat(
            [p.detach().reshape(-1) for p in self.strategy.replicated_parameters()]
        ).double()
        position = torch.arange(flat.numel(), device=flat.device)
        return torch.stack([flat.sum(), (flat * position).sum()])

    def copy_from_first(self) -> None:
        """Rank 0's replicated parameters on every rank: an identical start."""
        self.ranks.copy_from_first(self.strategy.replicated_state())

    def state_dict(self) -> dict[str, Any]:
        """The model, optimizers, RNG and counters, as full tensors: a
        collective when sharded (every rank calls it)."""
        return {
            **self.strategy.full_state(),
            "sharding": self.config.sharding,
            "rng": torch.get_rng_state(),
            "step": self.steps,
            "examples": self.examples,
            "records": self.records,
            "dead_letters": self.dead_letters,
        }

    def close(self) -> None:
        """Let the model and its optimizers go: TorchRec's sharded modules
        hold the process group
        (:func:`~trainer.training.ranks.leave_process_group`)."""
        del self.strategy

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint's state; this rank's metrics are its own
        when the world size is the checkpoint's, else rank 0's."""
        self.strategy.load_full_state(state)
        torch.set_rng_state(state["rng"])
        self.steps, self.examples = int(state["step"]), int(state["examples"])
        self.records = int(state.get("records", 0))
        self.dead_letters = int(state.get("dead_letters", 0))
        ranks = state["metrics"]
        rank = self.ranks.rank if len(ranks) == self.ranks.world else 0
        self.metrics.load_state_dict(ranks[rank])
