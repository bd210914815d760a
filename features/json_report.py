"""Reports as JSON: the commands' reports hold plain values only."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def json_safe(value: Any) -> Any:
    """JSON-safe: NaN → null, Paths and tuples made plain.

    Example:
        >>> json_safe({"ne": float("nan"), "path": Path("a"), "sizes": (1, 2)})
        {'ne': None, 'path': 'a', 'sizes': [1, 2]}
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value
