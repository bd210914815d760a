"""The daemon's checkpoints: what a run resumes from, and each one it writes.

Exactly once: model, optimizer, RNG, metrics and the next offset of every
partition are one atomic checkpoint (:mod:`trainer.training.checkpoint`);
a restart seeks to those offsets. A checkpoint is written on every rank's
behalf by rank 0, between collectives every rank makes in the same order:
the metrics gather, the replicated parameters' checksums, the full state
(a collective when sharded), and rank 0's word on whether the file is
durable. Only then are the offsets committed to the consumer group.

The offsets are every rank's merged: each partition any rank was assigned
(its start entered on assignment, :mod:`trainer.data.kafka_source`) or
applied a record of, so a checkpoint is never silent on a partition its run
read. Beside them: the topic's id and every offset gap of the run
(:mod:`trainer.data.offset_check`).

Each checkpoint carries a lineage id and its parent's id; the records
applied since the parent are kept until a checkpoint holding them is
written, so :class:`AppliedLog` can prove exactly once from the chain.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.data.kafka_source import KafkaSource
from trainer.metrics.reporting import Reporter
from trainer.training.checkpoint import (
    CheckpointWriteError,
    NoUsableCheckpointError,
    model_record,
    resume_state,
    save_checkpoint,
)
from trainer.training.daemon_trainer import DaemonTrainer
from trainer.training.ranks import Ranks
from trainer.training.run_config import DaemonConfig

log = logging.getLogger("trainer.daemon")

Restored = tuple[dict[str, Any], Path]
"""A verified checkpoint's state, and its path."""
LineageEntry = dict[str, Any]
"""``id``, ``parent`` (None for the first), ``step`` and ``records``: the
``[partition, offset]`` pairs applied since the parent checkpoint."""


def run_identity(config: DaemonConfig) -> dict[str, str]:
    """What a checkpoint must match to be resumed by this run."""
    return {"topic": config.topic, "model": config.model, "preset": config.preset}


def restore(config: DaemonConfig, rank: int) -> Restored | None:
    """The checkpoint this run resumes from; None: a new model.

    Raises:
        NoUsableCheckpointError: none verifies (and no ``start_fresh``), or
            the newest that does belongs to another topic or model.
    """
    loaded = resume_state(
        config.checkpoint_dir, start_fresh=config.start_fresh, set_aside=rank == 0
    )
    if loaded is None:
        return None
    state, path = loaded
    identity = state.get("run", {"topic": state.get("topic", config.topic)})
    wanted = run_identity(config)
    differs = {k: v for k, v in identity.items() if wanted.get(k) != v}
    if differs:
        raise NoUsableCheckpointError(
            f"checkpoint {path} belongs to another run ({differs}, this run has "
            f"{ {k: wanted[k] for k in differs} }); point --checkpoint-dir at "
            "this run's directory"
        )
    return loaded


class AppliedLog:
    """Appends each checkpoint's :data:`LineageEntry` to a JSON-lines file,
    durably, so a test can follow the final checkpoint's lineage back and
    find every record of the topic exactly once."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, entry: LineageEntry) -> None:
        with open(self.path, "a") as file:
            file.write(json.dumps(entry) + "\n")
            file.flush()
            os.fsync(file.fileno())


class DaemonCheckpointer:
    """Writes the daemon's checkpoints and keeps their lineage.

    Args:
        config: the run (directory, keep, identity).
        trainer: the state to write.
        source: the offsets to write, and to commit once written.
        reporter: told of every checkpoint written or failed.
        restored: the checkpoint the run resumed from (its lineage goes on).
        on_checkpoint: called on rank 0 with each checkpoint's
            :data:`LineageEntry` before the checkpoint is written.

    Rank 0 hands each checkpoint written to the run's serving export
    (:class:`~trainer.export.periodic.PeriodicExport`, with ``--artifacts``),
    which exports it in a subprocess when due; :meth:`close` waits for the
    last one.
    """

    def __init__(
        self,
        config: DaemonConfig,
        trainer: DaemonTrainer,
        source: KafkaSource,
        reporter: Reporter,
        restored: Restored | None,
        on_checkpoint: Callable[[LineageEntry], None] | None = None,
    ) -> None:
        self.config = config
        self.trainer = trainer
        self.ranks: Ranks = trainer.ranks
        self.source = source
        self.reporter = reporter
        self.on_checkpoint = on_checkpoint
        self.export = config.periodic_export() if self.ranks.rank == 0 else None
        self.lineage: str | None = restored[0]["lineage"] if restored else None
        self.last_good: Path | None = restored[1] if restored else None
        # (partition, offset) applied since the last checkpoint, all ranks'.
        self.applied: list[list[int]] = []

    def write(self, final: bool = False) -> bool:
        """Write one on every rank's behalf (every rank calls it); False,
        logged and with the state untouched, when it cannot be written: its
        records then go into the next checkpoint's lineage."""
        metrics = self.ranks.gather_objects(self.trainer.metrics.state_dict())
        offsets, gaps = self._merged_offsets()
        # Ranks must hold equal copies; a cheap checksum proves it.
        sums = self.ranks.gather(self.trainer.checksums())
        new_id = uuid.uuid4().hex
        started = time.perf_counter()
        state = self.trainer.state_dict()
        state.update(
            offsets={str(p): o for p, o in offsets.items()},
            topic_id=self.source.topic_id,
            offset_gaps=gaps,
            metrics=metrics,
            lineage=new_id,
            parent=self.lineage or "",
            topic=self.config.topic,
            run=run_identity(self.config),
            **model_record(
                self.config.model, self.config.preset, self.trainer.model_config
            ),
            world_size=self.ranks.world,
            param_checksums=[t.tolist() for t in sums],
        )
        gathered = time.perf_counter() - started
        written = self.ranks.rank != 0 or self._save(state, final, gathered)
        # Sync point: the checkpoint is durable (or known lost) before commits.
        if not self.ranks.first_says(written):
            return False
        self.lineage, self.applied = new_id, []
        self.source.request_commit()
        return True

    def _merged_offsets(self) -> tuple[dict[int, int], list[dict[str, Any]]]:
        """Every rank's next offsets (the largest per partition) and gaps;
        each rank's source takes them too, so any rank can resume any."""
        offsets: dict[int, int] = {}
        gaps: dict[tuple[Any, ...], dict[str, Any]] = {}
        for ranks_offsets, ranks_gaps in self.ranks.gather_objects(
            (self.source.offsets(), self.source.gaps())
        ):
            for partition, offset in ranks_offsets.items():
                offsets[partition] = max(offset, offsets.get(partition, offset))
            for gap in ranks_gaps:
                gaps.setdefault((gap["partition"], gap["from"], gap["to"]), gap)
        for partition, offset in offsets.items():
            self.source.mark(partition, offset)
        return offsets, list(gaps.values())

    def _save(self, state: dict[str, Any], final: bool, gathered: float) -> bool:
        """Rank 0: the lineage entry, then the file; False if it is not written."""
        step = self.trainer.steps
        if self.on_checkpoint is not None:
            # Before the rename: an orphan entry is harmless.
            entry = {
                "id": state["lineage"],
                "parent": self.lineage,
                "step": step,
                "records": self.applied,
            }
            self.on_checkpoint(entry)
        started = time.perf_counter()
        try:
            path = save_checkpoint(
                self.config.checkpoint_dir, state, keep=self.config.keep
            )
        except CheckpointWriteError as error:
            self.reporter.checkpoint_failed()
            log.error(
                "checkpoint step %d NOT written: %s; %s",
                step,
                error,
                "stopping"
                if final
                else "training goes on, the next checkpoint retries",
            )
            return False
        self.last_good = path
        self.reporter.checkpoint_written(step)
        if self.export is not None:
            self.export.checkpoint_written(path, step)
        log.info(
            "checkpoint step %d: %.2f MB, gather %.3f s, write %.3f s",
            step,
            path.stat().st_size / 1e6,
            gathered,
            time.perf_counter() - started,
        )
        return True

    def close(self) -> None:
        """Wait for a serving export still running (the run is over)."""
        if self.export is not None:
            self.export.close()
