"""``PooledDoFn``: a DoFn whose per-element work runs on a worker thread.

The job's per-shard work is numpy / Arrow kernels that release the GIL
(sorts, searches, gathers, hashing, IPC). A runner gives a worker one bundle
at a time and calls ``process`` on one thread, so a worker with two cores
would leave one idle while a shard is deduplicated, its timelines built, its
counters counted, one DoFn after the other. A :class:`PooledDoFn` hands each
element's work (:meth:`PooledDoFn.compute`) to a small thread pool and emits
the results, in input order, from ``process`` and ``finish_bundle`` on the
bundle's own thread: the DoFns fused after it work on shard ``k`` while the
pool already computes shard ``k + 1``.

Nothing here is runner-specific: outputs are emitted where Beam expects them
(``finish_bundle`` results as ``WindowedValue`` in the global window, where
this batch job runs), Beam metrics are updated on the bundle's thread
(:meth:`PooledDoFn.emit`), and a bundle's elements are all emitted before it
finishes. At most :attr:`PooledDoFn.max_pending` results wait at once, which
bounds the memory held.

The pool's size is the DoFn's :class:`~pipelines.batch.tuning.WorkerTuning`
(``--worker-threads``): one thread where the job runs in one local process,
none (work on the bundle's thread, same outputs in the same order) on
runners that run several SDK workers per machine. A DoFn whose fused
successors only queue work (:attr:`PooledDoFn.emits_little`) takes one
thread more where it has any: its bundle's thread mostly waits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from pipelines.batch.tuning import TunedDoFn


class PooledDoFn(TunedDoFn):
    """Base of DoFns whose work per element runs on a thread pool.

    Subclasses implement :meth:`compute` (thread-safe: no Beam calls, no
    shared mutable state) and may override :meth:`prepare` and :meth:`emit`
    (both on the bundle's thread). The pool has ``tuning.threads`` threads.
    """

    max_pending = 3
    """Results computed ahead of the downstream DoFns, at most."""

    emits_little = False
    """Whether the DoFns fused after this one do little with its results: the
    bundle's thread then mostly waits, so the pool takes one more thread for
    the core it leaves free."""

    def pool_size(self) -> int:
        """Threads of the pool: ``tuning.threads``, one more if :attr:`emits_little`."""
        threads = self.tuning.threads
        return threads + 1 if threads and self.emits_little else threads

    def setup(self) -> None:
        """The pool (none for 0 threads), and the process's memory settings."""
        super().setup()
        self._pool: ThreadPoolExecutor | None = None
        if self.pool_size() > 0:
            self._pool = ThreadPoolExecutor(
                self.pool_size(), thread_name_prefix=type(self).__name__
            )
        self._pending: deque[Future[Any]] = deque()

    def start_bundle(self) -> None:
        """Nothing is pending at the start of a bundle."""
        self._pending = deque()

    def prepare(self, element: Any) -> Any:
        """What :meth:`compute` gets, made on the bundle's thread. Grouped
        values (a GroupByKey's iterables) must be materialized here: a runner
        may fetch them lazily through its state API, from this thread only."""
        return element

    def compute(self, element: Any) -> Any:
        """The element's work, on a pool thread; its result goes to :meth:`emit`."""
        raise NotImplementedError

    def emit(self, result: Any) -> Iterable[Any]:
        """Outputs of one :meth:`compute` result (on the bundle's thread)."""
        return result  # type: ignore[no-any-return]

    def process(
        self, element: Any, window: Any = beam.DoFn.WindowParam
    ) -> Iterator[Any]:
        """Queue the element's work; emit the results that are done, in order."""
        yield from self.submit(self.prepare(element), window)

    def submit(self, work: Any, window: Any) -> Iterator[Any]:
        """Queue ``compute(work)``; emit the results that are done, in order.

        (Subclasses whose ``process`` takes side inputs call this with the
        element and the side inputs together.)
        """
        if not isinstance(window, GlobalWindow):
            # Results may leave in a later element's window or finish_bundle.
            raise ValueError(f"{type(self).__name__} runs in the global window only")
        self.enqueue(work)
        while self._pending and (
            self._pending[0].done() or len(self._pending) > self.max_pending
        ):
            yield from self.emit(self._pending.popleft().result())

    def enqueue(self, work: Any) -> None:
        """Queue ``compute(work)``, its results to leave with the next ones
        (for work made up in ``finish_bundle``, before the parent's)."""
        if self._pool is not None:
            self._pending.append(self._pool.submit(self.compute, work))
            return
        done: Future[Any] = Future()
        try:
            done.set_result(self.compute(work))
        except Exception as error:  # raised where a pool's would be: .result()
            done.set_exception(error)
        self._pending.append(done)

    def finish_bundle(self) -> Iterator[Any]:
        """Emit the remaining results (global window: a batch job's)."""
        while self._pending:
            for output in self.emit(self._pending.popleft().result()):
                if isinstance(output, beam.pvalue.TaggedOutput):
                    yield beam.pvalue.TaggedOutput(output.tag, _windowed(output.value))
                else:
                    yield _windowed(output)

    def teardown(self) -> None:
        """Stop the pool."""
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)


def _windowed(value: Any) -> WindowedValue:
    return WindowedValue(value, MIN_TIMESTAMP, [GlobalWindow()])
