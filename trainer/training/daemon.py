"""``python -m trainer.daemon``: train GEM continuously from a Kafka topic.

    python -m trainer.daemon --kafka-bootstrap HOST:PORT --topic examples \\
        --checkpoint-dir ckpt/ [--model gem --preset default] [--idle-seconds 10] \\
        [--metrics-jsonl m.jsonl --prometheus-port 9108 --tensorboard tb/]
    torchrun --nproc-per-node 2 -m trainer.daemon ...   # data parallel, gloo

``python -m trainer.daemon --help`` lists every flag
(:mod:`trainer.daemon`); ``--kafka-bootstrap`` is required: the
daemon trains from the cluster the feature job publishes into.

Loop, per iteration: take one decoded message (a batch) from this rank's
partitions → all-gather who has what → one step, whose forward (before the
update) scores the batch for progressive validation → mark offsets →
checkpoint every N steps. Exactly once: model, optimizer, RNG, metrics and
next offsets are one atomic checkpoint; a restart seeks to those offsets
(:mod:`trainer.data.kafka_source`).
Checkpoints are verified on load (:mod:`trainer.training.checkpoint`): a corrupt one
is set aside and the previous one used; when checkpoint files exist but none
verifies, the daemon exits 2 with one line saying what to do, unless
``--start-fresh`` (then a new model reads the topic from its earliest
offsets). Run-wide counters (records, examples, dead letters) live in the
checkpoint, so they count the whole run across restarts. A checkpoint that
cannot be written (a full disk) is logged as an error naming the checkpoint
kept; training goes on and the next one retries; if the final one fails the
daemon exits 3. SIGTERM/SIGINT: finish the step, checkpoint, commit the
offsets to the group, exit 0. ``--idle-seconds``
makes the run bounded: it ends once every rank saw nothing for that long.
Every way out of the loop (signal, idle, ``--max-steps``, a rank's consumer
failing) is decided from the all-gathered records, so all ranks leave at the
same step and then enter the same collectives in the same order: the final
checkpoint, the metrics gather, the process-group teardown. Under torchrun a
rank dies with the launcher (``PR_SET_PDEATHSIG``): torchrun starts ranks in
sessions of their own, so killing it, even its process group, would leave
them training and checkpointing next to the run that replaces them.

Data parallel (gloo on CPU): every rank is a member of the same group and
owns some partitions. Ranks step in lockstep: each iteration all-gathers a
6-int record per rank; if any rank has a batch, all step; a rank without one
contributes zero gradient and zero weight to an example-weighted gradient
all-reduce (DDP would need a forward on every rank, which an empty rank
cannot do). Same init, same averaged gradients → equal parameters.

``--sharding model-parallel`` shards the embedding tables with TorchRec
(:mod:`trainer.distributed.sharding`): big tables table-wise on one rank each, small
pooled ones replicated, the dense part replicated with the same
example-weighted all-reduce. Every rank then runs every forward and backward
(the tables' all-to-alls are collectives): a rank without a batch runs a
borrowed one with weight 0. The default stays ``replicated``: it keeps one
Adam over everything (fbgemm's fused CPU kernel has no Adam, so sharded
tables train with Adagrad) and needs no process group in one process, so
existing runs and checkpoints are unchanged. Model-parallel is for tables
that do not fit one rank and pays off in multi-rank runs (no whole-table
all-reduce per step): see ``benchmarks/README.md``.
Checkpoints hold full, unsharded tensors under the unsharded names in both
modes (gathered to rank 0), so they restore on any world size.

Test-only: ``GEM_DAEMON_APPLIED_LOG`` appends, at every checkpoint, the
records applied since its parent checkpoint (lineage id → parent id), so a
test can prove exactly-once from the checkpoint chain.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from features.kafka import KafkaSettings
from trainer.data.kafka_source import KafkaSource
from trainer.distributed.model_parallel import borrow_batch
from trainer.distributed.sharding import build_strategy
from trainer.distributed.tables import OptimizerConfig, resolve_embedding_optimizer
from trainer.metrics.progressive import ProgressiveMetrics
from trainer.metrics.prometheus import RunTotals
from trainer.metrics.reporting import Reporter
from trainer.models.base_rate import BaseRateOffset, prior_logits
from trainer.models.config import preset as preset_config
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import build_model, model_config
from trainer.training.checkpoint import (
    CheckpointWriteError,
    NoUsableCheckpointError,
    model_record,
    resume_state,
    save_checkpoint,
)
from trainer.training.device import resolve_device
from trainer.training.run_config import DaemonConfig
from trainer.training.step import scored

log = logging.getLogger("trainer.daemon")
APPLIED_LOG_ENV = "GEM_DAEMON_APPLIED_LOG"
# Per-rank record exchanged every iteration (see the module docstring).
HAS_BATCH, EXAMPLES, PARTITION, OFFSET, STOP, DRAINED, READY, FAILED = range(8)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
EXIT_NO_CHECKPOINT = 2
EXIT_CHECKPOINT_WRITE = 3


def _die_with_launcher() -> None:
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


class _Stop:
    """SIGTERM/SIGINT → a flag the loop checks between steps."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        log.info("signal %d: finishing the step, then checkpointing", signum)
        self.requested = True


def run(config: DaemonConfig, settings: KafkaSettings) -> dict[str, Any]:
    """Run the daemon until stopped or drained; returns the final metrics."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = resolve_device(config.device)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.set_device(device)
    backend = "nccl" if on_gpu else "gloo"
    if distributed and not dist.is_initialized():
        dist.init_process_group(backend)
    if config.sharding == "model-parallel" and not dist.is_initialized():
        # TorchRec's sharded modules need a process group, even of one.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    # Before the model is built: a directory to refuse is refused at once.
    loaded = resume_state(
        config.checkpoint_dir, start_fresh=config.start_fresh, set_aside=rank == 0
    )
    if loaded is not None:
        _check_run(loaded[0], loaded[1], config)
    stop = _Stop()
    torch.manual_seed(config.seed)
    # Start every task's output at a prior rate: progressive validation scores
    # from the very first batch, and a model at p = 0.5 would spend its first
    # steps (and ruin the lifetime metrics) just learning the base rate.
    model = GEMTrain(
        BaseRateOffset(
            build_model(config.model, config.preset),
            prior_logits(config.prior_click_rate, config.prior_conversion_rate),
        )
    )
    optimizers = OptimizerConfig(
        lr=config.lr,
        embedding_optimizer=resolve_embedding_optimizer(
            config.embedding_optimizer, config.sharding
        ),
        embedding_lr=config.embedding_lr,
    )
    strategy = build_strategy(
        model, config.sharding, optimizers, device, config.min_sharded_rows
    )
    metrics = ProgressiveMetrics(config.window_examples)
    step, examples, offsets, lineage = 0, 0, {}, None
    records, dead_letters = 0, 0  # run-wide: every record applied, poison included
    if loaded is not None:
        state, path = loaded
        strategy.load_full_state(state)
        torch.set_rng_state(state["rng"])
        step, examples = int(state["step"]), int(state["examples"])
        records = int(state.get("records", 0))
        dead_letters = int(state.get("dead_letters", 0))
        offsets = {int(p): int(o) for p, o in state["offsets"].items()}
        lineage = state["lineage"]
        ranks = state["metrics"]
        metrics.load_state_dict(ranks[rank] if len(ranks) == world else ranks[0])
        log.info(
            "rank %d resumed from %s: step %d, offsets %s", rank, path, step, offsets
        )
    if distributed:  # belt and braces: identical start on every rank
        with torch.no_grad():
            for tensor in strategy.replicated_state():
                dist.broadcast(tensor, 0)
    sharded = config.sharding == "model-parallel"
    idle_batch: Any = None  # model-parallel: what a rank without data runs
    max_seq_len = model_config(
        config.model, preset_config(config.preset)
    ).embedding.max_seq_len
    source = KafkaSource(
        settings,
        config.topic,
        config.group,
        max_seq_len=max_seq_len,
        offsets=offsets,
        queue_size=config.queue_size,
        dead_letter=config.dead_letter,
        pin_memory=on_gpu,
        # A new model beside unusable checkpoints has seen none of the topic.
        start_at_earliest=loaded is None and config.start_fresh,
    ).start()
    reporter = Reporter(
        jsonl=config.metrics_jsonl,
        prometheus_port=config.prometheus_port,
        prometheus_address=config.metrics_address,
        tensorboard_dir=config.tensorboard_dir,
        enabled=rank == 0,
        restored=RunTotals(
            step=step,
            examples=examples,
            dead_letters=dead_letters,
            checkpoint=loaded[1],
        )
        if loaded is not None
        else None,
    )
    reporter.watch_consumer(config.topic, source.lag)
    applied: list[
        list[int]
    ] = []  # (partition, offset) since the last checkpoint, all ranks
    loss = torch.zeros(())
    failure: RuntimeError | None = None  # this rank's consumer thread died
    failed: list[int] = []  # ranks whose consumer died (from the records)
    final_written = False
    last_good = loaded[1] if loaded is not None else None

    def checkpoint(final: bool = False) -> bool:
        """Write one; False (logged, state untouched) when it cannot be written."""
        nonlocal lineage, applied, last_good
        states = [metrics.state_dict()]
        if distributed:  # every rank's metrics; the offsets are already global
            states = [None] * world
            dist.all_gather_object(states, metrics.state_dict())
        # Ranks must hold equal copies; a cheap checksum proves it.
        flat = torch.cat(
            [p.detach().reshape(-1) for p in strategy.replicated_parameters()]
        ).double()
        position = torch.arange(flat.numel(), device=flat.device)
        mine = torch.stack([flat.sum(), (flat * position).sum()])
        sums = [mine]
        if distributed:
            sums = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(sums, mine)
        new_id = uuid.uuid4().hex
        started = time.perf_counter()
        full = strategy.full_state()  # a collective when sharded: every rank
        gathered = time.perf_counter()
        written = True
        if rank == 0:
            applied_log = os.environ.get(APPLIED_LOG_ENV)
            if applied_log:  # before the rename: an orphan entry is harmless
                entry = {
                    "id": new_id,
                    "parent": lineage,
                    "step": step,
                    "records": applied,
                }
                with open(applied_log, "a") as file:
                    file.write(json.dumps(entry) + "\n")
                    file.flush()
                    os.fsync(file.fileno())
            try:
                path = save_checkpoint(
                    config.checkpoint_dir,
                    {
                        **full,
                        "sharding": config.sharding,
                        "rng": torch.get_rng_state(),
                        "step": step,
                        "examples": examples,
                        "records": records,
                        "dead_letters": dead_letters,
                        "offsets": {str(p): o for p, o in source.offsets().items()},
                        "metrics": states,
                        "lineage": new_id,
                        "parent": lineage or "",
                        "topic": config.topic,
                        "run": _run_identity(config),
                        **model_record(
                            config.model,
                            config.preset,
                            model_config(config.model, preset_config(config.preset)),
                        ),
                        "world_size": world,
                        "param_checksums": [t.tolist() for t in sums],
                    },
                    keep=config.keep,
                )
            except CheckpointWriteError as error:
                written = False
                reporter.checkpoint_failed()
                log.error(
                    "checkpoint step %d NOT written: %s; %s",
                    step,
                    error,
                    "stopping"
                    if final
                    else "training goes on, the next checkpoint retries",
                )
            else:
                last_good = path
                reporter.checkpoint_written(step)
                log.info(
                    "checkpoint step %d: %.2f MB, gather %.3f s, write %.3f s",
                    step,
                    path.stat().st_size / 1e6,
                    gathered - started,
                    time.perf_counter() - gathered,
                )
        if distributed:
            # Sync point: the checkpoint is durable (or known lost) before commits.
            outcome = torch.tensor([int(written)], device=device)
            dist.broadcast(outcome, 0)
            written = bool(outcome.item())
        if not written:
            return False  # its records go into the next checkpoint's lineage
        lineage, applied = new_id, []
        source.request_commit()
        return True

    def report() -> None:
        # .item() is a host sync point: only at the log cadence and the end.
        reporter.log(
            step=step,
            examples=examples,
            loss=float(loss.item()),
            dead_letters=dead_letters,
            metrics=metrics,
        )

    try:
        while True:
            try:
                item = source.next(timeout=0.05 if distributed else 0.2)
            except RuntimeError as error:
                # Raised after the collective stop, or the peers would be left
                # in the next all-gather with a dead rank.
                failure, item = error, None
            mine = torch.tensor(
                [
                    int(item is not None and item.batch is not None),
                    item.examples if item else 0,
                    item.partition if item else -1,
                    item.offset if item else -1,
                    int(stop.requested),
                    int(
                        config.idle_seconds is not None
                        and source.drained(config.idle_seconds)
                    ),
                    int(
                        idle_batch is not None
                        or (item is not None and item.batch is not None)
                    ),
                    int(failure is not None),
                ],
                dtype=torch.int64,
                device=device,  # nccl gathers GPU tensors only
            )
            if item is not None and item.batch is not None and on_gpu:
                # Pinned on the decode thread: the copy overlaps with compute.
                item = dataclasses.replace(
                    item, batch=item.batch.to(device, non_blocking=True)
                )
            if distributed:
                everyone = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(
                    everyone, mine
                )  # sync point: lockstep, once per iteration
            else:
                everyone = [mine]
            total = sum(int(r[EXAMPLES]) for r in everyone)
            if any(int(r[HAS_BATCH]) for r in everyone):
                mine_batch = item.batch if item is not None else None
                if sharded and mine_batch is not None:
                    idle_batch = mine_batch
                if sharded and not all(int(r[READY]) for r in everyone):
                    lender = next(i for i, r in enumerate(everyone) if r[HAS_BATCH])
                    borrowed = borrow_batch(mine_batch, lender)
                    idle_batch = idle_batch if idle_batch is not None else borrowed
                result = strategy.step(
                    mine_batch if mine_batch is not None else idle_batch,
                    int(mine[EXAMPLES]) if mine_batch is not None else 0,
                    total,
                )
                loss = result.loss
                if mine_batch is not None and result.logits is not None:
                    # Progressive validation: the step's forward ran before
                    # its update, and the models have no train-only layers.
                    metrics.update(scored(result.logits, mine_batch))
                step += 1
                examples += total
            for r in everyone:
                if int(r[PARTITION]) >= 0:
                    source.mark(int(r[PARTITION]), int(r[OFFSET]) + 1)
                    records += 1
                    if int(r[HAS_BATCH]):
                        applied.append([int(r[PARTITION]), int(r[OFFSET])])
                    else:
                        dead_letters += 1
            source.iteration_done()
            reporter.count(step=step, examples=examples, dead_letters=dead_letters)
            stepped = int(any(int(r[HAS_BATCH]) for r in everyone))
            if stepped and step % config.log_every == 0:
                report()
            failed = [i for i, r in enumerate(everyone) if int(r[FAILED])]
            done = (
                bool(failed)
                or any(int(r[STOP]) for r in everyone)
                or all(int(r[DRAINED]) for r in everyone)
                or (config.max_steps is not None and step >= config.max_steps)
            )
            if done:
                break
            if stepped and step % config.checkpoint_every == 0:
                checkpoint()
        # Every rank is here at the same step. A failed consumer does not
        # spoil the state: offsets are marked only for applied records.
        final_written = checkpoint(final=True)
        report()
    finally:
        source.close()
    final = metrics
    if distributed:
        states: list[Any] = [None] * world
        dist.all_gather_object(states, metrics.state_dict())
        final = ProgressiveMetrics.merged(states)
    png = reporter.plot(config.plot) if config.plot else None
    reporter.close()
    if failure is not None:
        raise failure
    if failed:
        raise RuntimeError(f"stopped: the Kafka consumer of rank(s) {failed} failed")
    if not final_written:
        raise CheckpointWriteError(
            f"the final checkpoint (step {step}) could not be written to "
            f"{config.checkpoint_dir}; free space there and restart: the last good "
            f"checkpoint, {last_good.name if last_good else '(none)'}, is kept "
            "and the records since it are replayed"
        )
    log.info("rank %d stopped at step %d (%d examples)", rank, step, examples)
    return {
        "step": step,
        "examples": examples,
        "records": records,
        "dead_letters": dead_letters,
        "metrics": final.table("lifetime"),
        "window": final.table("last_window"),
        "png": str(png) if png else None,
        "offsets": source.offsets(),
    }


def _run_identity(config: DaemonConfig) -> dict[str, str]:
    """What a checkpoint must match to be resumed by this run."""
    return {"topic": config.topic, "model": config.model, "preset": config.preset}


def _check_run(state: dict[str, Any], path: Path, config: DaemonConfig) -> None:
    """A verified checkpoint of another topic or model is no place to resume."""
    identity = state.get("run", {"topic": state.get("topic", config.topic)})
    wanted = _run_identity(config)
    differs = {k: v for k, v in identity.items() if wanted.get(k) != v}
    if differs:
        raise NoUsableCheckpointError(
            f"checkpoint {path} belongs to another run ({differs}, this run has "
            f"{ {k: wanted[k] for k in differs} }); point --checkpoint-dir at "
            "this run's directory"
        )


def run_daemon_until_drained(
    settings: KafkaSettings,
    topic: str,
    group: str,
    checkpoint_dir: Path | str,
    *,
    model: str = "gem",
    preset: str = "tiny",
    idle_seconds: float = 5.0,
    **options: Any,
) -> dict[str, Any]:
    """Train on ``topic`` until it has been idle ``idle_seconds``, in this process.

    For the demo: returns ``{"metrics": {"domain/objective": {ne, auc,
    calibration, count, positives}}, "png": path, "step", "examples", ...}``.
    The PNG lands in ``checkpoint_dir/progressive_ne.png`` unless ``plot=``.
    """
    directory = Path(checkpoint_dir)
    config = DaemonConfig(
        topic=topic,
        group=group,
        checkpoint_dir=directory,
        model=model,
        preset=preset,
        idle_seconds=idle_seconds,
        plot=options.pop("plot", directory / "progressive_ne.png"),
        **options,
    )
    return run(config, settings)
