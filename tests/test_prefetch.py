"""features.prefetch: order kept, errors handed over, the producer stopped."""

from __future__ import annotations

import threading

import pytest

from features.prefetch import prefetch


def test_prefetch_keeps_order_and_hands_errors_to_the_consumer() -> None:
    assert list(prefetch(iter(range(50)), depth=2)) == list(range(50))

    def failing() -> object:
        yield 1
        raise ValueError("bad batch")

    stream = prefetch(failing())
    assert next(stream) == 1
    with pytest.raises(ValueError, match="bad batch"):
        next(stream)


def test_prefetch_stops_its_producer_when_the_consumer_stops() -> None:
    produced = []
    stopped = threading.Event()

    def endless() -> object:
        try:
            i = 0
            while True:
                produced.append(i)
                yield i
                i += 1
        finally:
            stopped.set()

    stream = prefetch(endless(), depth=2)
    assert [next(stream) for _ in range(3)] == [0, 1, 2]
    stream.close()
    assert stopped.wait(5)
    assert len(produced) <= 3 + 2 + 1  # at most `depth` (and one in hand) ahead


def test_a_generator_runs_on_the_named_worker_thread() -> None:
    def where() -> object:
        yield threading.current_thread().name

    assert list(prefetch(where(), name="batch-prefetch")) == ["batch-prefetch"]
