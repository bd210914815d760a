"""What every placement strategy offers the daemon's loop, and the
example-weighted gradient all-reduce they share."""

from __future__ import annotations

from typing import Any, Final, Literal, NamedTuple, Protocol

import torch
import torch.distributed as dist
from torch import nn

from trainer.data.batch import Batch

Sharding = Literal["replicated", "model-parallel"]
SHARDINGS: Final = ("replicated", "model-parallel")


def rank_and_size() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def weighted_allreduce(params: list[nn.Parameter], total_examples: int) -> None:
    """Σ_r (n_r g_r) / N over ranks, in place (rank r backpropagated n_r loss_r)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
    if dist.is_initialized():
        dist.all_reduce(flat)  # sync point: every rank reaches it once per step
    flat /= total_examples
    # copy_, not vector_to_parameters: a data-parallel table's .grad is a view
    # into its batched kernel's gradient, and rebinding .data would not reach it.
    offset = 0
    for p in params:
        grad = p.grad
        assert grad is not None
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


class Stepped(NamedTuple):
    """A step's loss and its forward's logits (B, NUM_DOMAINS, O), made
    before the update, detached; ``logits`` is None where no forward ran."""

    loss: torch.Tensor
    logits: torch.Tensor | None


class Strategy(Protocol):
    """What the daemon needs from a placement strategy."""

    model: nn.Module  # callable batch → (loss, outputs), on every rank
    sharding: Sharding

    def step(self, batch: Batch, examples: int, total_examples: int) -> Stepped:
        """One step; ``examples`` = 0 marks a rank without a batch."""
        ...

    def full_state(self) -> dict[str, Any]:
        """Model and optimizer state, unsharded (a collective; full on rank 0)."""
        ...

    def load_full_state(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`full_state`'s output (every rank reads it)."""
        ...

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every rank holds a copy of (to prove they are equal)."""
        ...

    def replicated_state(self) -> list[torch.Tensor]:
        """Tensors every rank holds a copy of (broadcast from rank 0 at start)."""
        ...
