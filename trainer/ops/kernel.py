"""Kernel selection for the jagged ops.

Every op has one public dispatcher (in :mod:`trainer.ops.jagged` and
:mod:`trainer.ops.attention`) that takes ``kernel=``. The pure-PyTorch
reference (:mod:`trainer.ops.pytorch`) is the default and the test oracle.
``Kernel.FBGEMM`` asks for ``torch.ops.fbgemm``; whether fbgemm is importable
and has a kernel for the tensor's device is checked **at call time**, never at
import, and the reference runs when it has not (e.g. CUDA without fbgemm-gpu,
or the CPU-only fbgemm wheel with CUDA tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

import torch


class Kernel(StrEnum):
    """Which implementation a jagged op runs.

    Example:
        >>> Kernel("fbgemm") is Kernel.FBGEMM
        True
    """

    PYTORCH = "pytorch"
    FBGEMM = "fbgemm"


_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


def fbgemm_op(name: str, device: torch.device) -> Callable[..., Any] | None:
    """``torch.ops.fbgemm.<name>`` if it has a kernel for ``device``, else None.

    Loads ``fbgemm_gpu`` on first use (which registers the ops); any failure
    means "not available".

    Example:
        >>> op = fbgemm_op("jagged_to_padded_dense", torch.device("cpu"))
        >>> op is None or callable(op)
        True
    """
    try:
        import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm.*)

        op = getattr(torch.ops.fbgemm, name)
    except (ImportError, AttributeError, RuntimeError, OSError):
        return None
    key = _DISPATCH_KEYS.get(device.type)
    if key is None:
        return None
    qualified = op.default.name() if hasattr(op, "default") else f"fbgemm::{name}"
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key):
        return None
    return op
