"""Ctrl-C and SIGTERM as exceptions, raised where no Kafka client swallows them.

A demo stops by unwinding: the signal becomes an exception, and every
``with`` block on the way out stops what it started (the embedded broker,
child processes). kafka-python's network loop (``kafka.net.selector``)
catches ``BaseException`` around each of its tasks and only logs it, so an
exception raised by a signal handler while the main thread runs that loop
would be lost and the demo would run on. :func:`unwind_on_signals` raises
only outside kafka-python's frames; a signal that arrives inside them is sent
again a moment later.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType

import kafka

RETRY_S = 0.05
"""How long a signal caught inside kafka-python's frames waits to be resent."""


_KAFKA_DIR = str(Path(kafka.__file__).parent) + os.sep


def _in_kafka(frame: FrameType | None) -> bool:
    """Whether any frame of the stack from ``frame`` down runs kafka-python."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(_KAFKA_DIR):
            return True
        frame = frame.f_back
    return False


def _unwind(signum: int, frame: FrameType | None) -> None:
    if _in_kafka(frame):
        resend = threading.Timer(RETRY_S, os.kill, (os.getpid(), signum))
        resend.daemon = True
        resend.start()
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def unwind_on_signals() -> None:
    """From now on Ctrl-C raises ``KeyboardInterrupt`` and SIGTERM
    ``SystemExit(143)``, each outside kafka-python's frames. Call it from
    the main thread, where Python runs signal handlers."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _unwind)
