"""Minimal reproduction: no local Beam runner streams a Python unbounded SDF.

    python -m benchmarks.streaming_runner_repro [fnapi|bundle]

A splittable DoFn plays a live source: three partitions, each delivering 100
elements every 0.1 s of wall time (3,000 elements per partition) with a
manual watermark estimator, deferring its remainder every 2 s; a stateful
DoFn with an event-time timer prints when each 500-element step is released.
On a streaming runner (Flink, Dataflow) the first release comes after about
0.5 s; measured with Beam 2.77 on this machine:

- ``fnapi`` (``--runner=DirectRunner --streaming`` picks the FnApiRunner when
  no processing-time timer is used): the first release comes only when the
  source's residuals are drained (9.5 s into a 14 s run, the source taking
  about 9 s), i.e. stage after stage; ``defer_remainder`` delays are ignored.
- ``bundle`` (the BundleBasedDirectRunner, which DirectRunner picks with a
  processing-time timer): fails to expand the SDF ("was not replaced as
  expected"); with its streaming overrides re-applied it fails in the SDF
  checkpoint ("OffsetRestrictionTracker is not done" for a generator
  ``process``, an ``AssertionError`` on a ``SplitResultResidual`` restriction
  for a list-returning one).

The streaming job (``pipelines/streaming/``) is therefore written for
portable runners (``defer_remainder``, keyed state, event-time timers) and
checked locally in bounded runs (``--stream-idle-seconds``), which the
FnApiRunner executes correctly.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct import direct_runner
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Duration, Timestamp

PER_PARTITION = 3_000
STARTED = time.monotonic()


class _Unbounded(RestrictionProvider):  # type: ignore[misc]
    def initial_restriction(self, element: str) -> OffsetRange:
        return OffsetRange(0, sys.maxsize)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: str, restriction: OffsetRange) -> int:
        return 1


_RESTRICTION = beam.DoFn.RestrictionParam(_Unbounded())
_WATERMARK = beam.DoFn.WatermarkEstimatorParam(
    ManualWatermarkEstimator.default_provider()
)
_BUFFER = BagStateSpec("buffer", VarIntCoder())
_STEP = TimerSpec("step", TimeDomain.WATERMARK)
_BUFFER_PARAM = beam.DoFn.StateParam(_BUFFER)
_STEP_PARAM = beam.DoFn.TimerParam(_STEP)


class LiveSource(beam.DoFn):  # type: ignore[misc]
    """100 elements per 0.1 s, watermark = last position, defer every 2 s."""

    @beam.DoFn.unbounded_per_element()
    def process(
        self,
        element: str,
        tracker: Any = _RESTRICTION,
        watermark: Any = _WATERMARK,
    ) -> Iterator[Any]:
        started = time.monotonic()
        position = tracker.current_restriction().start
        while True:
            if position >= PER_PARTITION:
                tracker.try_claim(sys.maxsize - 1)
                return
            time.sleep(0.1)
            for _ in range(100):
                if not tracker.try_claim(position):
                    return
                yield beam.window.TimestampedValue(
                    (element, position), Timestamp(position)
                )
                position += 1
            watermark.set_watermark(Timestamp(position))
            if time.monotonic() - started > 2.0:
                tracker.defer_remainder(Duration.of(0))
                return


class ReleaseSteps(beam.DoFn):  # type: ignore[misc]
    """Buffer per key; an event-time timer releases each 500-element step."""

    def process(
        self,
        element: tuple[str, int],
        buffer: Any = _BUFFER_PARAM,
        step: Any = _STEP_PARAM,
    ) -> None:
        buffer.add(element[1])
        step.set(Timestamp(element[1] // 500 * 500 + 500))

    @on_timer(_STEP)
    def release(
        self,
        key: Any = beam.DoFn.KeyParam,
        fire: Any = beam.DoFn.TimestampParam,
        buffer: Any = _BUFFER_PARAM,
    ) -> None:
        held = len(list(buffer.read()))
        buffer.clear()
        print(
            f"{time.monotonic() - STARTED:6.2f} s  {key}: released {held} "
            f"elements at event time {fire}",
            flush=True,
        )


def main(mode: str) -> None:
    """Run the repro on one runner."""
    options = PipelineOptions(["--streaming"])
    pipeline = beam.Pipeline(options=options)
    _ = (
        pipeline
        | beam.Create(["p0", "p1", "p2"])
        | beam.ParDo(LiveSource())
        | beam.ParDo(ReleaseSteps())
    )
    if mode == "bundle":
        overrides = direct_runner._get_transform_overrides(options)
        again = [o for o in overrides if type(o).__name__.startswith("Streaming")]
        pipeline.replace_all(overrides + again)
        runner = direct_runner.BundleBasedDirectRunner()
        runner.run_pipeline(pipeline, options).wait_until_finish()
    else:
        pipeline.run().wait_until_finish()
    print(f"done after {time.monotonic() - STARTED:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fnapi")
