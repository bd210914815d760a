"""Ctrl-C and SIGTERM reach the demos even from inside kafka-python's loop,
which catches ``BaseException`` around its tasks (its real selector here)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from kafka.net.selector import NetworkSelector

from demos.interrupts import RETRY_S, unwind_on_signals


@pytest.fixture
def unwinding() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    unwind_on_signals()
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _signal_inside_kafka_loop(sig: signal.Signals) -> None:
    """Run one kafka-python task on this thread that signals this process."""

    async def signal_self() -> None:
        os.kill(os.getpid(), sig)

    net = NetworkSelector()
    try:
        net.call_soon(signal_self)
        net.poll(timeout_ms=0)
    finally:
        net.close()


@pytest.mark.usefixtures("unwinding")
@pytest.mark.parametrize(
    ("sig", "raised"),
    [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit)],
)
def test_a_signal_inside_kafka_pythons_loop_is_raised_after_it(
    sig: signal.Signals, raised: type[BaseException]
) -> None:
    left_loop: list[bool] = []

    def signal_then_wait() -> None:
        _signal_inside_kafka_loop(sig)
        left_loop.append(True)
        time.sleep(20 * RETRY_S)  # the resent signal lands here

    with pytest.raises(raised) as caught:
        signal_then_wait()
    assert left_loop, "the exception was raised inside kafka-python's loop"
    if raised is SystemExit:
        assert caught.value.code == 128 + signal.SIGTERM


def test_kafka_pythons_loop_swallows_an_exception_raised_in_it() -> None:
    # Why the demos need unwind_on_signals: with Python's own Ctrl-C
    # handler, the KeyboardInterrupt dies inside the loop.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _signal_inside_kafka_loop(signal.SIGINT)
    except KeyboardInterrupt:
        pytest.fail("kafka-python lets it through now: demos.interrupts can go")
    finally:
        signal.signal(signal.SIGINT, saved)


@pytest.mark.usefixtures("unwinding")
def test_a_signal_outside_kafka_is_raised_at_once() -> None:
    def signal_then_spin() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # a handler runs between bytecodes, not later
            pass
        pytest.fail("not raised at once")

    with pytest.raises(KeyboardInterrupt):
        signal_then_spin()
