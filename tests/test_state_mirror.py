"""The state mirror on Beam's own runner: what it serves equals the bags.

A stateful DoFn keeps chunks through :class:`StateMirror` and, on every
element, checks what the mirror serves against a direct read of the bag. The
pipeline runs twice in one process (the FnApiRunner's workers share it), so
the second run meets the first run's copies under the same keys: their
tokens are not in the new run's state, and it must not see them. The budget
holds fewer keys than there are, so copies are also evicted and rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.coders import BytesCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.userstate import BagStateSpec

from pipelines.streaming.state_mirror import TOKEN, StateMirror
from pipelines.streaming.tables import state_bytes, state_table

KEYS, PER_KEY = 6, 12
_BAG = BagStateSpec("values", BytesCoder())
_BAG_PARAM = beam.DoFn.StateParam(_BAG)
_TOKEN_PARAM = beam.DoFn.StateParam(TOKEN)
_MIRROR = StateMirror(decode=state_table, size=len, budget_bytes=3 * 700)


def _values(table: pa.Table) -> list[int]:
    return [int(v) for v in table.column("v").to_pylist()]


class KeepAndCheck(beam.DoFn):  # type: ignore[misc]
    def process(
        self,
        element: tuple[int, int],
        bag: Any = _BAG_PARAM,
        token: Any = _TOKEN_PARAM,
    ) -> Iterator[tuple[int, int, bool]]:
        key, value = element
        state = _MIRROR.open(key, token, {"values": bag})
        chunk = pa.table({"v": pa.array([value], pa.int64())})
        state.add("values", state_bytes(chunk), chunk)
        served = sorted(v for _, t in state.chunks("values") for v in _values(t))
        if len(served) % 4 == 0:  # compact now and then, as the stages do
            whole = pa.table({"v": pa.array(served, pa.int64())})
            state.replace("values", [(state_bytes(whole), whole)])
        stored = sorted(v for b in bag.read() for v in _values(state_table(b)))
        yield key, len(served), served == stored


def _run() -> None:
    elements = [(k, k * 100 + i) for k in range(KEYS) for i in range(PER_KEY)]
    options = PipelineOptions(["--runner=FnApiRunner"])
    with beam.Pipeline(options=options) as pipeline:
        out = (
            pipeline
            | beam.Create(elements)
            | beam.Reshuffle()
            | beam.ParDo(KeepAndCheck())
        )
        expected = [(k, n, True) for k in range(KEYS) for n in range(1, PER_KEY + 1)]
        assert_that(out, equal_to(expected))


def test_the_mirror_serves_what_the_bags_hold_across_runs_and_evictions() -> None:
    _run()
    hits_after_first = _MIRROR.hits
    _run()
    assert _MIRROR.misses >= 2 * KEYS  # each run starts from its own state
    assert _MIRROR.hits > hits_after_first  # and the mirror does serve reads
    assert _MIRROR.evictions > 0
