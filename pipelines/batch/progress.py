"""A progress bar of the batch job: event files read, as the runner counts them.

The bar shows the job's own metric ``event_files_read`` (one per event file
read to its end, :class:`~pipelines.batch.inputs.ReadEventFileFn`) out of the
files the job was given, polled from the running job through the runner's
job service; nothing is estimated. It appears where ``pipeline.run()``
returns while the job runs and the runner answers metric queries meanwhile:
a job server (Prism for ``--runner=DirectRunner``, Flink, Spark). The
in-process FnApiRunner (the default) returns when the job is done, so there
is nothing to show there; on anything but a terminal there is no bar at all
(:func:`features.cli.progress`).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Final

from apache_beam.metrics.metric import MetricsFilter
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.runners.portability.portable_runner import (
    PipelineResult,
    PortableMetrics,
)
from apache_beam.runners.runner import PipelineState

from features.cli import progress
from pipelines.batch.validate import METRICS_NAMESPACE

FILES_READ: Final = "event_files_read"
POLL_SECONDS: Final = 0.5


def follow(result: Any, files: int, *, enabled: bool | None = None) -> None:
    """Show the files read until the job ends (returns at once where the
    runner cannot say; see the module docstring)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled or not isinstance(result, PipelineResult) or files == 0:
        return
    with progress("event files read", files, enabled=enabled) as bar:
        shown = 0
        done = False
        while not done:
            # The last poll after the end: the bar closes on the final count.
            done = PipelineState.is_terminal(result.state)
            read = files_read(result)
            if read > shown:
                bar.advance(read - shown)
                shown = read
            if not done:
                time.sleep(POLL_SECONDS)


def files_read(result: PipelineResult) -> int:
    """Event files read so far: attempted (bundles in flight count), or
    committed where the runner reports only those (Prism may).

    Asks the job service anew each time: ``result.metrics()`` keeps the first
    answer, which the job's summary must not get before the job is done.
    """
    request = beam_job_api_pb2.GetJobMetricsRequest(job_id=result._job_id)
    metrics = PortableMetrics(result._job_service.GetJobMetrics(request))
    query = metrics.query(
        MetricsFilter().with_namespace(METRICS_NAMESPACE).with_name(FILES_READ)
    )
    return sum(
        max(int(counter.attempted or 0), int(counter.committed or 0))
        for counter in query["counters"]
    )
