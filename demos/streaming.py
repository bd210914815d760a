"""``make demo-stream``: the streaming job, Feast pushes and the trainer together.

    python -m demos.streaming [--users 300 --days 3 --rate 2000]
        [--broker-down-seconds 3] [--no-trainer] [--output demo-output/stream]

What runs, on the embedded broker, for a bounded time:

1. a generated world; its first day goes through the batch reference job
   (the historical backfill) so Feast has tables to register; the repository
   is applied (embedded SQLite online store);
2. the trainer daemon (``python -m trainer.daemon``) and the streaming job
   (``python -m pipelines.build --streaming --runner=DirectRunner``, which
   runs on Prism) start; a few malformed messages go to the events topic
   first, and their dead letters coming out of the job show that it reads;
3. the generator then publishes *every* event to the events topic at a steady
   rate (events in time order, as a live stream); the job keeps per-user /
   per-ad state, pushes fresh counters and sequences to Feast, publishes
   examples once their label window closes, dead-letters what is invalid or
   too late, and stops when the topic has been idle (``--stream-idle-seconds``);
   the trainer trains on the examples topic as they arrive;
4. half-way through the publishing the broker is killed (SIGKILL, as a crash)
   and started again on the same port and data ``--broker-down-seconds``
   later: the publisher, the job and the trainer wait for it and resume,
   and nothing is lost.

At the end one screen: counts that add up (events published = on the topic
= read = valid + dead letters; examples released = on the topic = trained
on, and the topic holds each of the batch job's examples of the same events
exactly once), events/s through the job, freshness p50 / p99 (event ->
example beyond the label window, event -> Feast online value, example ->
first training step), the trainer's progressive NE / AUC per (domain,
objective), and the outage. The figures also go to ``report.json``, and
``freshness.png`` plots the freshness samples and the NE over wall time, the
outage shaded. The exit status is 1 when the counts do not add up. Every
process it starts is stopped, also on Ctrl-C, SIGTERM or error.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from demos.interrupts import unwind_on_signals
from demos.stream.config import StreamDemoConfig
from demos.stream.run import run_stream_demo
from demos.stream.screen import render
from features.cli import HelpFormatter
from features.config_flags import add_config_flags, config_fields


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m demos.streaming",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
    )
    add_config_flags(parser, StreamDemoConfig)
    config = StreamDemoConfig(
        **config_fields(parser.parse_args(argv), StreamDemoConfig)
    )
    # A SIGTERM unwinds like Ctrl-C, so the children (each in its own
    # session) and the broker are stopped too.
    unwind_on_signals()
    report = run_stream_demo(config)
    print(render(report, config.output))
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
