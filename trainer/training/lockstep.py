"""The daemon's rank protocol: one all-gathered record per rank per iteration.

Every iteration each rank contributes a record of eight ints (the indices
below): whether it took a batch and how many examples it holds, the
partition and offset of the record it took (-1: none), whether a signal
asked it to stop, whether its source is drained, whether it can run a
forward, and whether its Kafka consumer failed. Everything after the gather
is decided from the gathered records alone, so every rank decides alike: if
any rank has a batch all step; every rank marks every taken record (so any
rank can resume any partition); and every way out of the loop (a signal,
idle, ``--max-steps``, a failed consumer) happens at the same step on every
rank, which then enter the same collectives in the same order.

Data parallel: a rank without a batch contributes zero gradient and zero
weight to the example-weighted gradient all-reduce (DDP would need a forward
on every rank, which an empty rank cannot do). Model parallel: every rank
runs every forward and backward (the tables' all-to-alls are collectives),
so a rank without a batch runs a stand-in with weight 0: the first batch
another rank lends it, or its own last one.
"""

from __future__ import annotations

import dataclasses

import torch

from trainer.data.batch import Batch
from trainer.data.kafka_source import Item
from trainer.distributed.model_parallel import borrow_batch
from trainer.training.ranks import Ranks

HAS_BATCH, EXAMPLES, PARTITION, OFFSET, STOP, DRAINED, READY, FAILED = range(8)


@dataclasses.dataclass(frozen=True)
class Gathered:
    """One iteration's gathered records, in rank order."""

    records: list[list[int]]

    @property
    def stepped(self) -> bool:
        """Some rank has a batch: every rank steps."""
        return any(r[HAS_BATCH] for r in self.records)

    @property
    def examples(self) -> int:
        """The step's examples over all ranks (the gradient's weights' sum)."""
        return sum(r[EXAMPLES] for r in self.records)

    @property
    def taken(self) -> list[tuple[int, int, bool]]:
        """``(partition, offset, applied)`` of each record a rank took; one
        that is not applied is a dead letter."""
        return [
            (r[PARTITION], r[OFFSET], bool(r[HAS_BATCH]))
            for r in self.records
            if r[PARTITION] >= 0
        ]

    @property
    def failed(self) -> list[int]:
        """The ranks whose Kafka consumer failed."""
        return [i for i, r in enumerate(self.records) if r[FAILED]]

    def finished(self, steps: int, max_steps: int | None) -> bool:
        """The loop ends after this iteration, on every rank."""
        return (
            bool(self.failed)
            or any(r[STOP] for r in self.records)
            or all(r[DRAINED] for r in self.records)
            or (max_steps is not None and steps >= max_steps)
        )


class Lockstep:
    """The rank protocol of one daemon run (see the module docstring).

    Args:
        ranks: this rank among the run's.
        sharded: the tables are model-parallel (every rank runs every step's
            forward, with a stand-in batch when it has none).
    """

    def __init__(self, ranks: Ranks, sharded: bool) -> None:
        self.ranks = ranks
        self.sharded = sharded
        self.stand_in: Batch | None = None

    def exchange(
        self, item: Item | None, *, stop: bool, drained: bool, failed: bool
    ) -> tuple[Gathered, Item | None]:
        """All-gather this rank's record of ``item``: what every rank sent, and ``item``
        with its batch on this rank's device."""
        has_batch = item is not None and item.batch is not None
        mine = torch.tensor(
            [
                int(has_batch),
                item.examples if item else 0,
                item.partition if item else -1,
                item.offset if item else -1,
                int(stop),
                int(drained),
                int(self.stand_in is not None or has_batch),
                int(failed),
            ],
            dtype=torch.int64,
            device=self.ranks.device,  # nccl gathers GPU tensors only
        )
        if item is not None and item.batch is not None:
            if self.ranks.device.type == "cuda":
                # Pinned on the decode thread: the copy overlaps with the gather.
                moved = item.batch.to(self.ranks.device, non_blocking=True)
                item = dataclasses.replace(item, batch=moved)
        everyone = self.ranks.gather(mine)  # sync point: once per iteration
        return Gathered([r.tolist() for r in everyone]), item

    def batch(self, gathered: Gathered, item: Item | None) -> tuple[Batch | None, int]:
        """What this rank steps on in an iteration that steps, and its weight (its
        own examples; 0 for a stand-in). Replicated, a rank without a batch
        steps on None."""
        own = item.batch if item is not None else None
        if self.sharded and own is not None:
            self.stand_in = own
        if self.sharded and not all(r[READY] for r in gathered.records):
            lender = next(i for i, r in enumerate(gathered.records) if r[HAS_BATCH])
            borrowed = borrow_batch(own, lender)  # a collective: every rank
            if self.stand_in is None:
                self.stand_in = borrowed
        if own is not None and item is not None:
            return own, item.examples
        return self.stand_in, 0
