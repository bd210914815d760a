"""The I/O-free hot path: one optimisation step, and evaluation helpers.

``train_step`` does no ``.item()``, ``.cpu()`` or printing: it returns
detached tensors, and the loop reads scalars only at its log cadence (each
read is a CPU-GPU sync point). The evaluation helpers do move predictions to
the host: they are for evaluation, not the training step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from features.metrics import BinaryMetrics, binary_metrics
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from trainer.data.batch import Batch
from trainer.models.loss_wrapper import GEMTrain
from trainer.modules.heads import own_domain
from trainer.ops import capture_jagged_sizes


class StepOutput(NamedTuple):
    """Detached results of one step.

    ``loss`` (), ``per_task`` (NUM_DOMAINS, O) per-task mean losses,
    ``logits`` (B, NUM_DOMAINS, O), ``grad_norm`` () total gradient norm
    before clipping (NaN-free only if the loss was finite).
    """

    loss: torch.Tensor
    per_task: torch.Tensor
    logits: torch.Tensor
    grad_norm: torch.Tensor


def train_step(
    model: GEMTrain,
    batch: Batch,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float = float("inf"),
) -> StepOutput:
    """Forward, backward, (clip), optimizer step. No host syncs.

    Args:
        model: a :class:`GEMTrain` wrapper (owns the loss).
        batch: a batch already on the model's device.
        optimizer: over ``model.parameters()``.
        max_grad_norm: clip the total gradient norm to this (``inf``: no clip).

    Example:
        >>> from trainer.models.registry import build_model
        >>> model = GEMTrain(build_model("dlrm", "tiny"))
        >>> optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        >>> callable(train_step)
        True
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss, outputs = model(mark_dynamic_batch(batch))
    loss.backward()
    grad_norm = clip_grad_norm(model.parameters(), max_grad_norm)
    optimizer.step()
    return StepOutput(
        outputs.loss, outputs.per_task, outputs.logits, grad_norm.detach()
    )


@torch.no_grad()
def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """The total gradient norm of ``parameters``, their gradients scaled down
    to ``max_norm`` when it is finite.

    ``nn.utils.clip_grad_norm_`` with two differences: it takes sparse
    gradients (the tables' under ``--optimizer adam+adagrad``), and with an
    infinite ``max_norm`` it does not rescale every gradient by 1.

    Example:
        >>> layer = nn.Linear(2, 1)
        >>> layer(torch.ones(1, 2)).sum().backward()
        >>> clip_grad_norm(layer.parameters(), 1.0).item() > 1.0
        True
        >>> round(clip_grad_norm(layer.parameters(), 1.0).item(), 4)
        1.0
    """
    with_grads = [p for p in parameters if p.grad is not None]
    if not with_grads:
        return torch.zeros(())
    grads = [p.grad for p in with_grads]
    # A sparse gradient may name a row twice: its norm is its coalesced one.
    total = nn.utils.get_total_norm(
        [g.coalesce().values() if g.is_sparse else g for g in grads]
    )
    if math.isfinite(max_norm):
        nn.utils.clip_grads_with_norm_(with_grads, max_norm, total)
    return total


def mark_dynamic_batch(batch: Batch) -> Batch:
    """Tell ``torch.compile`` which sizes of ``batch`` change from batch to batch.

    The history's total length ``L`` (the sequence KJT's values) differs in
    every batch. Marked, the first compile already treats it as symbolic;
    unmarked, dynamo compiles once for the first ``L`` and again (dynamic)
    on the second batch. A no-op for eager models. Returns ``batch``.

    Example:
        >>> from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        >>> kjt = KeyedJaggedTensor.from_lengths_sync(
        ...     keys=["a"], values=torch.arange(3), lengths=torch.tensor([3]))
        >>> batch = Batch(kjt, kjt, torch.zeros(1, 1), torch.zeros(1, 2),
        ...               torch.zeros(1, dtype=torch.long))
        >>> mark_dynamic_batch(batch) is batch
        True
    """
    torch._dynamo.maybe_mark_dynamic(batch.sequence.values(), 0)
    return batch


def compile_model(model: nn.Module, **kwargs: Any) -> nn.Module:
    """``torch.compile(model, **kwargs)`` set up for the jagged models.

    Calls :func:`trainer.ops.capture_jagged_sizes` first (process wide:
    dynamo captures ``.item()`` / ``.tolist()`` as unbacked SymInts), so that
    the jagged ops' data-dependent sizes and TorchRec's KJT splits trace into
    one graph instead of breaking it. Pair with :func:`mark_dynamic_batch` on
    every batch (``train_step`` and ``eval_step`` do it) so that new history
    lengths reuse the compiled graph.

    Example:
        >>> compiled = compile_model(nn.Linear(2, 2), backend="eager")
        >>> compiled(torch.zeros(1, 2)).shape
        torch.Size([1, 2])
    """
    capture_jagged_sizes()
    return torch.compile(model, **kwargs)  # type: ignore[return-value]


class EvalOutput(NamedTuple):
    """Own-domain probabilities (B, O), labels (B, O) and domain (B,), detached."""

    probs: torch.Tensor
    labels: torch.Tensor
    domain: torch.Tensor


@torch.no_grad()
def eval_step(model: nn.Module, batch: Batch) -> EvalOutput:
    """Predict one batch in eval mode: each example's own-domain probabilities.

    ``model`` is a bare model (batch → logits) or a :class:`GEMTrain`.
    """
    bare = model.model if isinstance(model, GEMTrain) else model
    was_training = bare.training
    bare.eval()
    logits = bare(mark_dynamic_batch(batch))
    bare.train(was_training)
    return scored(logits, batch)


def scored(logits: torch.Tensor, batch: Batch) -> EvalOutput:
    """``batch`` scored by ``logits`` (B, NUM_DOMAINS, O): own-domain
    probabilities beside the labels, detached."""
    # float32 before the sigmoid: under bf16 autocast a probability of 1e-2
    # would keep only ~3 significant digits, visible in NE and calibration.
    probs = torch.sigmoid(own_domain(logits.detach(), batch.domain).float())
    return EvalOutput(probs, batch.labels, batch.domain)


Predictions = dict[
    tuple[str, str], tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
]


def collect_predictions(outputs: Iterable[EvalOutput]) -> Predictions:
    """Group predictions by (domain, objective) name: ``{key: (labels, probs)}``.

    Domains without examples are absent.

    Example:
        >>> out = EvalOutput(torch.tensor([[0.2, 0.1]]), torch.tensor([[1.0, 0.0]]),
        ...                  torch.tensor([1]))
        >>> collect_predictions([out])[("instagram", "click")]
        (array([1.]), array([0.2]))
    """
    probs, labels, domain = [], [], []
    for out in outputs:
        probs.append(out.probs.detach().float().cpu())
        labels.append(out.labels.detach().float().cpu())
        domain.append(out.domain.detach().cpu())
    if not probs:
        return {}
    p = torch.cat(probs).double().numpy()
    y = torch.cat(labels).double().numpy()
    d = torch.cat(domain).numpy()
    result: Predictions = {}
    for di, dname in enumerate(DOMAINS):
        rows = d == di
        if not rows.any():
            continue
        for oi, oname in enumerate(TRAINING_OBJECTIVES):
            result[(dname, oname)] = (y[rows, oi], p[rows, oi])
    return result


def evaluate(
    model: nn.Module, batches: Iterable[Batch]
) -> dict[tuple[str, str], BinaryMetrics]:
    """NE, AUC and calibration per (domain, objective) over ``batches``."""
    predictions = collect_predictions(eval_step(model, batch) for batch in batches)
    return {key: binary_metrics(y, p) for key, (y, p) in predictions.items()}
