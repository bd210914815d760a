"""This process among a daemon run's ranks: the process group (joined, and
left), the rank's device, the collectives the daemon makes, and dying with
the launcher.

Under torchrun (``WORLD_SIZE`` > 1) every rank joins one process group (gloo
on the CPU, nccl on GPUs). ``--sharding model-parallel`` needs a group even
in one process (TorchRec's sharded modules), so it gets a group of one. Each
collective of :class:`Ranks` is a plain value when the run is not
distributed, so the daemon's code reads the same in one process and in many.

Under torchrun a rank dies with the launcher (``PR_SET_PDEATHSIG``): torchrun
starts ranks in sessions of their own, so killing it, even its process
group, would leave them training and checkpointing next to the run that
replaces them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import os
import signal
import sys
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from trainer.training.device import resolve_device

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_launcher() -> None:
    """Under torchrun, have the kernel SIGKILL this rank when torchrun dies."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != launcher:  # it died before the prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def leave_process_group() -> None:
    """Destroy this process's group, if it joined one, and with it gloo's
    threads, while the interpreter is whole.

    TorchRec's sharded modules keep the group in reference cycles, which
    only the garbage collector frees: collected first, the group's last
    reference goes with ``destroy_process_group``, which then joins gloo's
    worker and I/O threads. Left to interpreter teardown, those threads
    outlive it, and one that then lets go of a Python object aborts the
    process ("terminate called without an active exception").
    """
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This rank, the run's world size, the rank's device, and the
    collectives over all ranks (see the module docstring)."""

    rank: int
    world: int
    device: torch.device
    distributed: bool

    @classmethod
    def join(cls, device: str, sharding: str) -> Ranks:
        """Join the run's process group (see the module docstring)."""
        distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        where = resolve_device(device)
        if where.type == "cuda":
            torch.cuda.set_device(where)
        backend = "nccl" if where.type == "cuda" else "gloo"
        if distributed and not dist.is_initialized():
            dist.init_process_group(backend)
        if sharding == "model-parallel" and not dist.is_initialized():
            # TorchRec's sharded modules need a process group, even of one.
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1
            )
        if not distributed:
            return cls(0, 1, where, False)
        return cls(dist.get_rank(), dist.get_world_size(), where, True)

    def gather(self, mine: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``mine``, in rank order (nccl gathers GPU tensors only)."""
        if not self.distributed:
            return [mine]
        everyone = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(everyone, mine)
        return everyone

    def gather_objects(self, mine: Any) -> list[Any]:
        """Every rank's picklable ``mine``, in rank order."""
        if not self.distributed:
            return [mine]
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, mine)
        return everyone

    def first_says(self, value: bool) -> bool:
        """Rank 0's ``value``, on every rank."""
        if not self.distributed:
            return value
        outcome = torch.tensor([int(value)], device=self.device)
        dist.broadcast(outcome, 0)
        return bool(outcome.item())

    def copy_from_first(self, tensors: Iterable[torch.Tensor]) -> None:
        """Overwrite ``tensors`` in place with rank 0's."""
        if not self.distributed:
            return
        with torch.no_grad():
            for tensor in tensors:
                dist.broadcast(tensor, 0)
