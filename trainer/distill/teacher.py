"""The GEM teacher's checkpoint: train one, save it, load it, run it forward.

Only :mod:`trainer.distill.teacher_pass` (and the benchmark / demo that
train the teacher) import this module; students read the teacher's *outputs*
(:mod:`trainer.distill.records`) and, for parameter sharing, raw tensors of
its checkpoint (:mod:`trainer.distill.sharing`), never this code.

A teacher checkpoint is a :mod:`trainer.training.checkpoint` file (atomic write, the
same loader) that describes its model (:func:`trainer.training.checkpoint.model_record`:
name, preset, the full :class:`~trainer.models.config.ModelConfig`): the trainer
daemon's, ``trainer.fit --save``'s and :func:`train_teacher`'s all do, so the
model is rebuilt from the checkpoint alone. ``trained_until_ms`` (newest
example time trained on: the "teacher time" that student staleness is
measured against) is the file's modification time when the checkpoint does
not hold it (the daemon's).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from trainer.data.batch import Batch
from trainer.data.feature_output import ExampleDataset, event_time_ms
from trainer.models.base_rate import BaseRateOffset, prior_logits
from trainer.models.config import ModelConfig
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import build_model
from trainer.training.checkpoint import (
    model_from_record,
    model_record,
    read_model_checkpoint,
    save_checkpoint,
)
from trainer.training.fit import base_rate_logits
from trainer.training.fit_trainer import make_optimizer
from trainer.training.run_config import FitConfig
from trainer.training.step import train_step


class Teacher(NamedTuple):
    """A loaded teacher: the model (eval mode) and its checkpoint facts."""

    model: GEMTrain
    config: ModelConfig
    step: int
    time_ms: int
    path: Path


def train_teacher(
    data: ExampleDataset,
    config: ModelConfig,
    checkpoint_dir: Path,
    *,
    model_name: str = "gem",
    epochs: int = 1,
    batch_size: int = 256,
    lr: float = 2e-3,
    max_steps_per_epoch: int | None = None,
    seed: int = 0,
) -> Path:
    """Train a GEM teacher offline on ``data`` and save its checkpoint.

    The same recipe as :func:`trainer.training.fit.fit` (Adam, base-rate offsets,
    grad clip 10, a seeded epoch order); returns the checkpoint path.
    """
    torch.manual_seed(seed)
    model = GEMTrain(
        BaseRateOffset(build_model(model_name, config), base_rate_logits(data))
    )
    cfg = FitConfig(train=data.path, eval=data.path, model=model_name, lr=lr)
    optimizer = make_optimizer(model, cfg)
    step, newest = 0, 0
    times = event_time_ms(data.examples)
    for epoch in range(epochs):
        order = data.order(shuffle=True, seed=seed, epoch=epoch)
        chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        for rows in chunks[:max_steps_per_epoch]:
            train_step(model, data.batch(rows), optimizer, 10.0)
            newest = max(newest, int(times[rows].max()))
            step += 1
    return save_checkpoint(
        checkpoint_dir,
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "offsets": {},
            "trained_until_ms": newest,
            **model_record(model_name, None, config),
        },
    )


def load_teacher(path: Path, *, flag: str = "--teacher") -> Teacher:
    """Load a teacher checkpoint file, or the newest one in a directory.

    The model is the one the checkpoint describes; ``flag`` names ``path`` in
    the one-line error of a checkpoint that cannot be used
    (:func:`trainer.training.checkpoint.read_model_checkpoint`).
    """
    state, path = read_model_checkpoint(path, flag)
    model_name, config = model_from_record(state, path)
    # The offsets' initial values are overwritten by the state dict.
    model = GEMTrain(BaseRateOffset(build_model(model_name, config), prior_logits()))
    model.load_state_dict(state["model"])
    model.eval()
    time_ms = int(state.get("trained_until_ms", int(path.stat().st_mtime * 1000)))
    return Teacher(model, config, int(state["step"]), time_ms, path)


def summary_module(model: GEMTrain) -> torch.nn.Module:
    """The module whose *input* is the teacher's summary embedding (GEM heads)."""
    inner = (
        model.model.inner if isinstance(model.model, BaseRateOffset) else model.model
    )
    heads = getattr(inner, "heads", None)
    if not isinstance(heads, torch.nn.Module):
        raise TypeError(
            f"{type(inner).__name__} has no `heads`: the teacher must be a GEM model"
        )
    return heads


@torch.no_grad()
def teacher_forward(
    teacher: Teacher, batches: Iterator[Batch]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per batch: logits (B, Dm, O) and summary embeddings (B, E), as numpy.

    The summary embedding is the trunk output the PLE heads read (InterFormer's
    ``[X_sum ∥ S_sum]`` tokens, flattened): what GEM knows about the example
    before any (domain, objective) tower. Captured with a forward hook, so the
    teacher runs exactly once per example.
    """
    captured: list[torch.Tensor] = []
    hook = summary_module(teacher.model).register_forward_hook(
        lambda _m, inputs, _out: captured.append(inputs[0].detach())
    )
    try:
        for batch in batches:
            captured.clear()
            logits = teacher.model.model(batch)
            yield logits.float().numpy(), captured[0].float().numpy()
    finally:
        hook.remove()
