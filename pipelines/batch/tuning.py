"""How the job's DoFns use a worker process: compute threads and allocator.

Two settings pay off where the job runs in one local process, which then has
the machine's cores to itself: a thread per heavy DoFn that computes the next
shard while the bundle's thread emits the last (:mod:`.parallel`), and
allocators that keep freed memory for reuse (:mod:`.memory`). On runners
that run several SDK workers per machine (Flink, Spark, Dataflow, a portable
job server, the FnApiRunner with several workers) each worker already has
its share of the cores and memory, so both are off there.

``--worker-threads N|auto`` and ``--tune-allocator`` / ``--no-tune-allocator``
(:mod:`.flags`) choose; ``auto`` (the default) is :func:`runs_in_one_process`.
The choice is made when the graph is built, from the pipeline's runner and
options, and travels inside each DoFn (:class:`TunedDoFn`), so a remote
worker applies what the launcher decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    PortableOptions,
)

from features.memory import reuse_freed_memory
from pipelines.beam.flags import AUTO
from pipelines.beam.options import GemBuildOptions

# Runners that may run the job on Prism or on the FnApiRunner, both local.
_LOCAL_DIRECT_RUNNERS: Final = frozenset(
    {"DirectRunner", "SwitchingDirectRunner", "TestDirectRunner"}
)
_LOOPBACK: Final = ("", "LOOPBACK")


@dataclass(frozen=True)
class WorkerTuning:
    """What a worker process does for the job's DoFns.

    Attributes:
        threads: compute threads per heavy DoFn beside the bundle's own
            thread; 0 computes on the bundle's thread.
        tune_allocator: keep freed memory for reuse (:mod:`.memory`).
    """

    threads: int = 1
    tune_allocator: bool = True


ONE_PROCESS: Final = WorkerTuning(threads=1, tune_allocator=True)
SHARED_MACHINE: Final = WorkerTuning(threads=0, tune_allocator=False)


def runs_in_one_process(runner: str, options: PipelineOptions) -> bool:
    """Whether ``runner`` (a class name) runs every SDK worker of the job in
    the launching process, one worker at a time: the FnApiRunner in memory
    with one worker, Prism (or a DirectRunner) with one loopback worker, the
    bundle-based DirectRunner."""
    direct = options.view_as(DirectOptions)
    portable = options.view_as(PortableOptions)
    fn_api_alone = (
        direct.direct_running_mode in (None, "in_memory")
        and direct.direct_num_workers == 1
    )
    prism_alone = (portable.environment_type or "").upper() in _LOOPBACK and (
        portable.sdk_worker_parallelism in (None, 1)
    )
    if runner == "BundleBasedDirectRunner":
        return True
    if runner == "FnApiRunner":
        return fn_api_alone
    if runner == "PrismRunner":
        return prism_alone
    if runner in _LOCAL_DIRECT_RUNNERS:
        return fn_api_alone and prism_alone
    return False


def tuning_for(runner: str, options: PipelineOptions) -> WorkerTuning:
    """The flags' choice, ``auto`` resolved for ``runner`` (a class name)."""
    flags = options.view_as(GemBuildOptions)
    alone = runs_in_one_process(runner, options)
    default = ONE_PROCESS if alone else SHARED_MACHINE
    threads = getattr(flags, "worker_threads", AUTO)
    tune = getattr(flags, "tune_allocator", None)
    return WorkerTuning(
        threads=default.threads if threads in (None, AUTO) else int(threads),
        tune_allocator=default.tune_allocator if tune is None else bool(tune),
    )


def pipeline_tuning(pipeline: beam.Pipeline) -> WorkerTuning:
    """The tuning of the DoFns of ``pipeline`` (by its runner and options)."""
    return tuning_for(type(pipeline.runner).__name__, pipeline.options)


class TunedDoFn(beam.DoFn):  # type: ignore[misc]
    """Base of the job's DoFns that follow a :class:`WorkerTuning`.

    Their transforms set it with :meth:`tuned` from the pipeline
    (:func:`pipeline_tuning`); a DoFn made on its own keeps the one-process
    tuning.
    """

    tuning: WorkerTuning = ONE_PROCESS

    def tuned(self, tuning: WorkerTuning) -> Any:
        """This DoFn, to run with ``tuning``."""
        self.tuning = tuning
        return self

    def setup(self) -> None:
        """The worker process's allocator settings, where chosen."""
        if self.tuning.tune_allocator:
            reuse_freed_memory()
