"""``python -m trainer.daemon``: train GEM continuously from a Kafka topic.

    python -m trainer.daemon --kafka-bootstrap HOST:PORT --topic examples \\
        --checkpoint-dir ckpt/ [--model gem --preset default] [--idle-seconds 10] \\
        [--metrics-jsonl m.jsonl --prometheus-port 9108 --tensorboard tb/]
    torchrun --nproc-per-node 2 -m trainer.daemon ...   # data parallel, gloo

``python -m trainer.daemon --help`` lists every flag
(:mod:`trainer.daemon`); ``--kafka-bootstrap`` is required: the
daemon trains from the cluster the feature job publishes into.

Loop, per iteration: take one decoded message (a batch) from this rank's
partitions → all-gather who has what (:mod:`trainer.training.lockstep`) →
one step (:class:`~trainer.training.daemon_trainer.DaemonTrainer`), whose
forward (before the update) scores the batch for progressive validation →
mark offsets → checkpoint every N steps
(:mod:`trainer.training.daemon_checkpoint`). Exactly once: model, optimizer,
RNG, metrics and next offsets are one atomic checkpoint; a restart seeks to
those offsets (:mod:`trainer.data.kafka_source`).

One writer per checkpoint directory: rank 0 holds its lock
(:mod:`features.directory_lock`) for the run; a second daemon on the same
directory exits 5 naming the holder. Checkpoints are verified on load
(:mod:`trainer.training.checkpoint`): a corrupt one is set aside and an
older one used; when checkpoint files exist but none verifies, the daemon
exits 4 with one line saying what to do, unless ``--start-fresh`` (then a
new model reads the topic from its earliest offsets). The checkpointed
offsets are checked against the topic on restore and on every assignment
(:mod:`trainer.data.offset_check`): records removed before they were
trained stop the run (exit 6) or, with ``--on-offset-gap continue``, are a
counted gap kept in the checkpoint; a recreated or truncated topic is
refused (exit 7). Exit statuses: :mod:`trainer.training.exits`.
Run-wide counters (records, examples, dead letters) live in the checkpoint,
so they count the whole run across restarts. A checkpoint that cannot be
written (a full disk) is logged as an error naming the checkpoint
kept; training goes on and the next one retries; if the final one fails the
daemon exits 3. SIGTERM/SIGINT: finish the step, checkpoint, commit the
offsets to the group, exit 0. ``--idle-seconds`` makes the run bounded: it
ends once every rank saw nothing for that long. Every way out of the loop is
decided from the all-gathered records, so all ranks leave at the same step
and then enter the same collectives in the same order: the final
checkpoint, the metrics gather, the process-group teardown
(:mod:`trainer.training.ranks`).

Data parallel (gloo on CPU): every rank is a member of the same group and
owns some partitions; the ranks step in lockstep with an example-weighted
gradient all-reduce, so equal starts and equal averaged gradients keep the
parameters equal. ``--sharding model-parallel`` shards the embedding tables
with TorchRec (:mod:`trainer.distributed.sharding`): big tables table-wise
on one rank each, small pooled ones replicated, the dense part replicated
with the same all-reduce. The default stays ``replicated``: one Adam over
everything and no process group in one process. Model-parallel is for
tables that do not fit one rank and pays off in multi-rank runs (no
whole-table all-reduce per step): see ``benchmarks/README.md``.

:data:`APPLIED_LOG_ENV` names a file where ``python -m trainer.daemon``
appends, at every checkpoint, the records applied since its parent
checkpoint (:class:`~trainer.training.daemon_checkpoint.AppliedLog`): the
fault tests prove exactly once from the checkpoint chain with it. In
process, :func:`run` takes the same seam as ``on_checkpoint``.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from features.directory_lock import DirectoryLock
from features.kafka import KafkaSettings
from trainer.data.kafka_source import KafkaSource
from trainer.data.offset_check import OffsetRefusedError
from trainer.metrics.progressive import ProgressiveMetrics
from trainer.metrics.prometheus import RunTotals
from trainer.metrics.reporting import Reporter
from trainer.training.checkpoint import CheckpointWriteError
from trainer.training.daemon_checkpoint import (
    DaemonCheckpointer,
    LineageEntry,
    Restored,
    restore,
)
from trainer.training.daemon_trainer import DaemonTrainer
from trainer.training.lockstep import Lockstep
from trainer.training.ranks import Ranks
from trainer.training.run_config import DaemonConfig

log = logging.getLogger("trainer.daemon")
APPLIED_LOG_ENV = "GEM_DAEMON_APPLIED_LOG"


class _Stop:
    """SIGTERM/SIGINT → a flag the loop checks between steps."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        log.info("signal %d: finishing the step, then checkpointing", signum)
        self.requested = True


class _Outcome(NamedTuple):
    """How the loop ended: this rank's consumer error, the failed ranks."""

    failure: Exception | None
    failed: list[int]


def run(
    config: DaemonConfig,
    settings: KafkaSettings,
    *,
    on_checkpoint: Callable[[LineageEntry], None] | None = None,
) -> dict[str, Any]:
    """Run the daemon until stopped or drained; returns the final metrics.

    ``on_checkpoint`` is called on rank 0 with each checkpoint's lineage
    entry, before the checkpoint is written.
    """
    ranks = Ranks.join(config.device, config.sharding)
    # Rank 0 writes the checkpoints: it holds the directory for the run.
    lock = DirectoryLock(config.checkpoint_dir, "--checkpoint-dir")
    if ranks.rank == 0:
        lock.acquire()
    try:
        return _run(config, settings, ranks, on_checkpoint)
    finally:
        lock.release()


def _run(
    config: DaemonConfig,
    settings: KafkaSettings,
    ranks: Ranks,
    on_checkpoint: Callable[[LineageEntry], None] | None,
) -> dict[str, Any]:
    """:func:`run`, the directory held."""
    # Before the model is built: a directory to refuse is refused at once.
    restored = restore(config, ranks.rank)
    stop = _Stop()
    trainer = DaemonTrainer(config, ranks)
    offsets: dict[int, int] = {}
    state: dict[str, Any] = restored[0] if restored is not None else {}
    if restored is not None:
        trainer.load_state_dict(state)
        offsets = {int(p): int(o) for p, o in state["offsets"].items()}
        log.info(
            "rank %d resumed from %s: step %d, offsets %s",
            ranks.rank,
            restored[1],
            trainer.steps,
            offsets,
        )
    trainer.copy_from_first()  # belt and braces: identical start on every rank
    source = KafkaSource(
        settings,
        config.topic,
        config.group,
        max_seq_len=trainer.model_config.embedding.max_seq_len,
        offsets=offsets,
        queue_size=config.queue_size,
        dead_letter=config.dead_letter,
        pin_memory=ranks.device.type == "cuda",
        topic_id=state.get("topic_id"),
        gaps=state.get("offset_gaps", []),
        on_gap=config.on_offset_gap,
    ).start()
    reporter = _reporter(config, trainer, restored)
    reporter.watch_consumer(config.topic, source.lag)
    reporter.watch_gaps(config.topic, source.gap_records)
    daemon = _Daemon(
        config,
        trainer,
        Lockstep(ranks, sharded=config.sharding == "model-parallel"),
        source,
        reporter,
        DaemonCheckpointer(config, trainer, source, reporter, restored, on_checkpoint),
    )
    try:
        outcome = daemon.train(stop)
        # Every rank is here at the same step. A failed consumer does not
        # spoil the state: offsets are marked only for applied records.
        final_written = daemon.checkpointer.write(final=True)
        daemon.report()
    finally:
        source.close()
        trainer.close()  # what follows needs the group, not the model
        daemon.checkpointer.close()
    return daemon.finish(outcome, final_written)


def _reporter(
    config: DaemonConfig, trainer: DaemonTrainer, restored: Restored | None
) -> Reporter:
    """The metrics sinks (rank 0's; no-ops elsewhere)."""
    totals = None
    if restored is not None:
        totals = RunTotals(
            step=trainer.steps,
            examples=trainer.examples,
            dead_letters=trainer.dead_letters,
            checkpoint=restored[1],
        )
    return Reporter(
        jsonl=config.metrics_jsonl,
        prometheus_port=config.prometheus_port,
        prometheus_address=config.metrics_address,
        tensorboard_dir=config.tensorboard_dir,
        enabled=trainer.ranks.rank == 0,
        restored=totals,
    )


@dataclasses.dataclass
class _Daemon:
    """One run's parts, wired by :func:`run`: the loop and its ending."""

    config: DaemonConfig
    trainer: DaemonTrainer
    lockstep: Lockstep
    source: KafkaSource
    reporter: Reporter
    checkpointer: DaemonCheckpointer

    def train(self, stop: _Stop) -> _Outcome:
        """Step in lockstep until the gathered records say every rank is done."""
        config, trainer, source = self.config, self.trainer, self.source
        failure: Exception | None = None  # this rank's consumer thread died
        timeout = 0.05 if trainer.ranks.distributed else 0.2
        while True:
            try:
                item = source.next(timeout=timeout)
            except (RuntimeError, OffsetRefusedError) as error:
                # Raised after the collective stop, or the peers would be left
                # in the next all-gather with a dead rank.
                failure, item = error, None
            drained = config.idle_seconds is not None and source.drained(
                config.idle_seconds
            )
            gathered, item = self.lockstep.exchange(
                item, stop=stop.requested, drained=drained, failed=failure is not None
            )
            if gathered.stepped:
                batch, examples = self.lockstep.batch(gathered, item)
                trainer.step(batch, examples, gathered.examples)
            for partition, offset, applied in gathered.taken:
                source.mark(partition, offset + 1)
                trainer.take(applied)
                if applied:
                    self.checkpointer.applied.append([partition, offset])
            source.iteration_done()
            self.reporter.count(
                step=trainer.steps,
                examples=trainer.examples,
                dead_letters=trainer.dead_letters,
            )
            if gathered.stepped and trainer.steps % config.log_every == 0:
                self.report()
            if gathered.finished(trainer.steps, config.max_steps):
                return _Outcome(failure, gathered.failed)
            if gathered.stepped and trainer.steps % config.checkpoint_every == 0:
                self.checkpointer.write()

    def report(self) -> None:
        """One metrics record."""
        trainer = self.trainer
        # .item() is a host sync point: only at the log cadence and the end.
        self.reporter.log(
            step=trainer.steps,
            examples=trainer.examples,
            loss=float(trainer.loss.item()),
            dead_letters=trainer.dead_letters,
            metrics=trainer.metrics,
        )

    def finish(self, outcome: _Outcome, final_written: bool) -> dict[str, Any]:
        """After the loop, on every rank: the merged metrics, the plot, and
        the run's failure raised, or its result."""
        config, trainer = self.config, self.trainer
        final = trainer.metrics
        if trainer.ranks.distributed:
            states = trainer.ranks.gather_objects(trainer.metrics.state_dict())
            final = ProgressiveMetrics.merged(states)
        png = self.reporter.plot(config.plot) if config.plot else None
        self.reporter.close()
        if outcome.failure is not None:
            raise outcome.failure
        if outcome.failed:
            raise RuntimeError(
                f"stopped: the Kafka consumer of rank(s) {outcome.failed} failed"
            )
        if not final_written:
            kept = self.checkpointer.last_good
            raise CheckpointWriteError(
                f"the final checkpoint (step {trainer.steps}) could not be written "
                f"to {config.checkpoint_dir}; free space there and restart: the "
                f"last good checkpoint, {kept.name if kept else '(none)'}, is kept "
                "and the records since it are replayed"
            )
        log.info(
            "rank %d stopped at step %d (%d examples)",
            trainer.ranks.rank,
            trainer.steps,
            trainer.examples,
        )
        return {
            "step": trainer.steps,
            "examples": trainer.examples,
            "records": trainer.records,
            "dead_letters": trainer.dead_letters,
            "metrics": final.table("lifetime"),
            "window": final.table("last_window"),
            "png": str(png) if png else None,
            "offsets": self.source.offsets(),
        }


def run_daemon_until_drained(
    settings: KafkaSettings,
    topic: str,
    group: str,
    checkpoint_dir: Path | str,
    *,
    idle_seconds: float = 5.0,
    **options: Any,
) -> dict[str, Any]:
    """Train on ``topic`` until it has been idle ``idle_seconds``, in this process.

    ``options`` are further :class:`DaemonConfig` fields (``preset="tiny"``
    for the unit tests' model). Returns ``{"metrics": {"domain/objective":
    {ne, auc, calibration, count, positives}}, "png": path, "step",
    "examples", ...}``; the PNG lands in ``checkpoint_dir/progressive_ne.png``
    unless ``plot=``.
    """
    directory = Path(checkpoint_dir)
    config = DaemonConfig(
        topic=topic,
        group=group,
        checkpoint_dir=directory,
        idle_seconds=idle_seconds,
        plot=options.pop("plot", directory / "progressive_ne.png"),
        **options,
    )
    return run(config, settings)
