"""Process memory settings for jobs that churn large arrays.

The feature job (both the Beam DoFns and the single-process reference) and
the trainer's processes allocate and free arrays of megabytes over and over:
Arrow IPC bytes at every shuffle, the runner's copies of them, numpy
temporaries, Arrow columns; a training step's activations and gradients.
With glibc's and mimalloc's defaults most of that memory goes back to the
kernel when freed and is faulted in again (zero-filled) by the next batch or
step, so the jobs spend much of their time in the kernel
(``benchmarks/README.md`` has the figures). :func:`reuse_freed_memory`
makes both allocators keep freed memory for reuse:

- Arrow allocates from the system allocator (``malloc``) instead of its
  bundled mimalloc, so that Arrow buffers, numpy arrays, Python bytes and
  torch's CPU tensors draw on one pool of retained memory;
- glibc keeps up to :data:`RETAINED_BYTES` of freed heap (``M_TOP_PAD``,
  ``M_TRIM_THRESHOLD``) and serves blocks up to 32 MB from the heap instead
  of mapping each anew (``M_MMAP_THRESHOLD``).

Applied once per process, in the process that runs the work: the feature
job's launcher (which is also the worker with an embedded runner) and every
worker's ``DoFn.setup``, where the job's tuning asks for it
(``--tune-allocator``, on by default only where the job runs in one local
process: :mod:`pipelines.batch.tuning`); the reference and every trainer
command apply it always. Explicit settings win: nothing changes for Arrow
when ``ARROW_DEFAULT_MEMORY_POOL`` is set, nor for glibc when any
``MALLOC_*_`` variable is; nothing happens off glibc. Neither Beam nor torch
is imported here.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Final

import pyarrow as pa

# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD: Final = -1
_M_TOP_PAD: Final = -2
_M_MMAP_THRESHOLD: Final = -3
RETAINED_BYTES: Final = 256 << 20
_MMAP_ABOVE: Final = 32 << 20  # glibc's ceiling for the mmap threshold
_GLIBC_VARIABLES: Final = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_THRESHOLD_",
)

_lock = threading.Lock()
_applied = False


def reuse_freed_memory() -> bool:
    """Keep freed memory in the process for reuse (see the module docstring).

    Idempotent and thread-safe; the settings last for the process.

    Returns:
        True the first time it is called in a process, else False.
    """
    global _applied
    with _lock:
        if _applied:
            return False
        _applied = True
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        pa.set_memory_pool(pa.system_memory_pool())
    if not any(name in os.environ for name in _GLIBC_VARIABLES):
        mallopt = _mallopt()
        if mallopt is not None:
            # All three: setting one turns off glibc's adaptive mmap
            # threshold, which would leave large blocks mapped anew each time.
            mallopt(_M_TOP_PAD, RETAINED_BYTES)
            mallopt(_M_TRIM_THRESHOLD, RETAINED_BYTES)
            mallopt(_M_MMAP_THRESHOLD, _MMAP_ABOVE)
    return True


def _mallopt() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """glibc's ``mallopt`` through ctypes, or None (another platform or libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int]
    function.restype = ctypes.c_int
    return function
