"""Kernel selection for the jagged ops.

Every op has one public dispatcher (in :mod:`trainer.ops.jagged` and
:mod:`trainer.ops.attention`) that takes ``kernel=``. The pure-PyTorch
reference (:mod:`trainer.ops.pytorch`) is the default and the test oracle.
``Kernel.FBGEMM`` asks for ``torch.ops.fbgemm``; whether fbgemm is importable
and has a kernel for the tensor's device is checked **at first use** (once per
op and device type, then cached), never at import, and the reference runs
when it has not (e.g. CUDA without fbgemm-gpu, or the CPU-only fbgemm wheel
with CUDA tensors). The check is a trace-time constant for ``torch.compile``.
"""

from __future__ import annotations

import functools
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
    means "not available". Under ``torch.compile`` the answer is a trace-time
    constant (no graph break).

    Example:
        >>> op = fbgemm_op("jagged_to_padded_dense", torch.device("cpu"))
        >>> op is None or callable(op)
        True
    """
    if not fbgemm_available(name, device.type):
        return None
    return getattr(torch.ops.fbgemm, name)  # type: ignore[no-any-return]


@torch.compiler.assume_constant_result  # type: ignore[untyped-decorator]
def fbgemm_available(name: str, device_type: str) -> bool:
    """Whether ``torch.ops.fbgemm.<name>`` has a kernel for ``device_type``.

    Looked up once per (name, device type). Dynamo calls it at trace time and
    keeps the result as a constant: the lookup itself (imports, dispatcher
    queries) is not traceable.

    Example:
        >>> fbgemm_available("no_such_op", "cpu")
        False
    """
    return _lookup(name, device_type)


@functools.cache
def _lookup(name: str, device_type: str) -> bool:
    try:
        import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm.*)

        op = getattr(torch.ops.fbgemm, name)
    except (ImportError, AttributeError, RuntimeError, OSError):
        return False
    key = _DISPATCH_KEYS.get(device_type)
    if key is None:
        return False
    qualified = op.default.name() if hasattr(op, "default") else f"fbgemm::{name}"
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key))


def capture_jagged_sizes() -> None:
    """Let ``torch.compile`` trace the jagged ops' data-dependent sizes.

    Sets ``torch._dynamo.config.capture_scalar_outputs = True`` (process
    wide). The ops that change a sequence's length (``jagged_pool``,
    ``jagged_truncate_last``) read their output total from the offsets with
    ``.item()``, and TorchRec reads a KJT's per-key lengths with ``.tolist()``
    when it splits one; captured, each read is an unbacked SymInt inside the
    graph, otherwise each one is a graph break. Call it before the first
    compiled call.

    Example:
        >>> capture_jagged_sizes()
        >>> torch._dynamo.config.capture_scalar_outputs
        True
    """
    torch._dynamo.config.capture_scalar_outputs = True
