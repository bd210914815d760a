"""An iterable produced on a worker thread, a bounded number of items ahead
of its consumer.

The Feast engine reads, encodes and writes on three threads this way; the
trainer builds batches ahead of its step. The producer runs the iterable
itself, so a generator's work happens on the worker thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from queue import Empty, Full, Queue
from typing import Any, Final, TypeVar

T = TypeVar("T")

_DONE: Final = object()


@dataclass(frozen=True)
class _Failed:
    error: BaseException


def prefetch(
    items: Iterable[T], depth: int = 2, *, name: str = "prefetch"
) -> Iterator[T]:
    """``items``, produced on a daemon thread called ``name`` up to ``depth``
    ahead of the consumer.

    An error in the producer is raised in the consumer; a consumer that
    stops early (breaks out, or closes the iterator) stops the producer,
    which is then joined.
    """
    queue: Queue[Any] = Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        queue.put(item, timeout=0.1)
                        break
                    except Full:
                        continue
                if stop.is_set():
                    return
            queue.put(_DONE)
        except BaseException as error:  # handed to the consumer
            queue.put(_Failed(error))

    worker = threading.Thread(target=produce, name=name, daemon=True)
    worker.start()
    try:
        while True:
            item = queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            with contextlib.suppress(Empty):
                queue.get_nowait()
            worker.join(timeout=0.05)
