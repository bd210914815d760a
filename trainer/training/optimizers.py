"""The dense optimizer every trainer here builds: Adam, fused where torch can.

``torch.optim.Adam`` defaults to a per-tensor loop on CPU. Its fused kernel
(one pass over every parameter per step, CPU and CUDA) updates the default
preset's parameters several times faster on a small CPU
(``benchmarks/bench_optimizer.py``), with the same update rule.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

_FUSED_DEVICES = frozenset({"cpu", "cuda"})


def adam(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Adam:
    """Adam over ``params``, fused when every one is a float tensor on CPU or CUDA.

    Example:
        >>> layer = nn.Linear(2, 1)
        >>> adam(layer.parameters(), lr=1e-3).defaults["fused"]
        True
    """
    params = list(params)
    fused = bool(params) and all(
        p.device.type in _FUSED_DEVICES and p.is_floating_point() for p in params
    )
    return torch.optim.Adam(params, lr=lr, fused=fused or None)
