"""Where a trainer runs, and in what precision its forward runs.

``--device auto`` picks this process's GPU when torch sees one (under
torchrun the rank's ``LOCAL_RANK``, else GPU 0) and the CPU otherwise; a
named device must exist. ``--precision bf16`` runs the forward under bf16
autocast on a GPU; on the CPU every precision is ``fp32``.
"""

from __future__ import annotations

import os

import torch

from trainer.training.run_config import PRECISIONS


def resolve_device(name: str) -> torch.device:
    """The device ``name`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) stands for.

    Raises:
        ValueError: ``name`` is a CUDA device and torch sees none.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: torch sees no CUDA device here")
    return device


def effective_precision(device: torch.device, precision: str) -> str:
    """The precision the forward runs in on ``device`` when asked for
    ``precision``: bf16 on a GPU only.

    Example:
        >>> effective_precision(torch.device("cpu"), "bf16")
        'fp32'
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose fp32 or bf16")
    return precision if device.type == "cuda" else "fp32"


def autocast_for(device: torch.device, precision: str) -> torch.autocast:
    """The forward's autocast context: bf16 on a GPU when asked, else off."""
    return torch.autocast(
        device.type,
        dtype=torch.bfloat16,
        enabled=effective_precision(device, precision) == "bf16",
    )
