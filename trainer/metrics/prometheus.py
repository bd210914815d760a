"""The ``/metrics`` endpoint of a training daemon (``prometheus_client``).

One :class:`DaemonMetrics` per process, with its own registry (two daemons in
one test process never clash) and a name prefix per daemon (``gem_trainer``,
``gem_student``). What it exports, all documented in ``docs/metrics.md``:

- run-wide counters ``<prefix>_examples_total``, ``_steps_total``,
  ``_dead_letters_total``, seeded from the checkpoint a run resumes from, so
  they continue across restarts (a restart is not a counter reset);
- ``<prefix>_consumer_lag_records{topic, partition}``: records not yet
  trained on, read at scrape time from the source's in-memory snapshot
  (:meth:`trainer.data.kafka_source.KafkaSource.lag`: no broker round trip);
- ``<prefix>_offset_gap_records_total{topic}``: offsets removed from the
  topic before they were trained, over the whole run (the checkpoint keeps
  each gap), read at scrape time from the source;
- ``<prefix>_last_checkpoint_age_seconds``: computed at scrape time, so it
  keeps growing while a daemon is stuck; ``_last_checkpoint_step`` and
  ``_checkpoint_write_failures_total`` beside it;
- gauges set per log interval: throughput, loss, and NE / AUC / calibration
  per (domain, objective, scope).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

QUALITY_LABELS = ("domain", "objective", "scope")
QUALITY_DOCS = {
    "ne": "progressive normalized entropy (log loss over the base rate's entropy; "
    "lower is better)",
    "auc": "progressive AUC (fixed-bin histogram)",
    "calibration": "progressive calibration: predicted over observed positives "
    "(1 is calibrated)",
}


@dataclass(frozen=True, kw_only=True)
class RunTotals:
    """Run-wide counts of the checkpoint a run resumed from."""

    step: int
    examples: int
    dead_letters: int
    checkpoint: Path | None = None


class _ConsumerLag(Collector):
    """One lag gauge per (topic, partition), asked of each source at scrape time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._sources: dict[str, Callable[[], Mapping[int, int]]] = {}
        self._lock = threading.Lock()

    def watch(self, topic: str, lag: Callable[[], Mapping[int, int]]) -> None:
        with self._lock:
            self._sources[topic] = lag

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            self.name,
            "records in the partition not yet trained on (end offset minus the "
            "next offset to train); this rank's partitions only",
            labels=["topic", "partition"],
        )
        with self._lock:
            sources = dict(self._sources)
        for topic, lag in sources.items():
            for partition, records in sorted(lag().items()):
                family.add_metric([topic, str(partition)], float(records))
        yield family


class _OffsetGaps(Collector):
    """One run-wide counter per topic, asked of each source at scrape time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._sources: dict[str, Callable[[], int]] = {}
        self._lock = threading.Lock()

    def watch(self, topic: str, records: Callable[[], int]) -> None:
        with self._lock:
            self._sources[topic] = records

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            self.name,
            "offsets removed from the topic (retention, delete_records) before "
            "they were trained; whole run, kept in the checkpoint",
            labels=["topic"],
        )
        with self._lock:
            sources = dict(self._sources)
        for topic, records in sources.items():
            family.add_metric([topic], float(records()))
        yield family


class DaemonMetrics:
    """Serve ``/metrics`` for one daemon (see the module docstring).

    Args:
        prefix: metric name prefix, e.g. ``gem_trainer``.
        port: TCP port to listen on (0 here picks a free one: the caller
            decides whether to serve at all).
        address: interface to listen on.
        restored: the resumed checkpoint's counts: the counters start from
            them before the endpoint serves, so no scrape sees a reset.
        training_gauges: export throughput, loss and NE / AUC / calibration
            (a daemon that sets none of them leaves them out).
    """

    def __init__(
        self,
        prefix: str,
        port: int,
        address: str = "127.0.0.1",
        *,
        restored: RunTotals | None = None,
        training_gauges: bool = True,
    ) -> None:
        self.prefix = prefix
        self.registry = CollectorRegistry()  # own registry: no global clashes
        r = self.registry
        continues = " (whole run: continues from the checkpoint across restarts)"
        self._examples = Counter(
            f"{prefix}_examples", "examples trained on" + continues, registry=r
        )
        self._steps = Counter(
            f"{prefix}_steps", "optimizer steps" + continues, registry=r
        )
        self._dead_letters = Counter(
            f"{prefix}_dead_letters",
            "records set aside as dead letters" + continues,
            registry=r,
        )
        self._checkpoint_failures = Counter(
            f"{prefix}_checkpoint_write_failures",
            "checkpoints that could not be written (this process)",
            registry=r,
        )
        self._counters = {
            "examples": self._examples,
            "steps": self._steps,
            "dead_letters": self._dead_letters,
        }
        self._totals = dict.fromkeys(self._counters, 0)
        self._checkpoint_at = time.monotonic()
        Gauge(
            f"{prefix}_last_checkpoint_age_seconds",
            "seconds since the last durable checkpoint (since the process "
            "started when there is none yet)",
            registry=r,
        ).set_function(lambda: time.monotonic() - self._checkpoint_at)
        self._checkpoint_step = Gauge(
            f"{prefix}_last_checkpoint_step",
            "step of the last durable checkpoint (-1: none yet)",
            registry=r,
        )
        self._checkpoint_step.set(-1)
        self._gauges: dict[str, Gauge] = {}
        self._quality: dict[str, Gauge] = {}
        if training_gauges:
            self._training_gauges()
        self._lag = _ConsumerLag(f"{prefix}_consumer_lag_records")
        r.register(self._lag)
        self._gaps = _OffsetGaps(f"{prefix}_offset_gap_records")
        r.register(self._gaps)
        if restored is not None:
            self._restore(restored)
        server, _ = start_http_server(port, addr=address, registry=r)
        self._server: Any = server
        self.port: int = server.server_port
        self.address = str(server.server_address[0])

    def _training_gauges(self) -> None:
        prefix, r = self.prefix, self.registry
        self._gauges = {
            "examples_per_second": Gauge(
                f"{prefix}_examples_per_second",
                "training throughput over the last log interval",
                registry=r,
            ),
            "loss": Gauge(
                f"{prefix}_loss", "training loss of the last step", registry=r
            ),
        }
        self._quality = {
            name: Gauge(f"{prefix}_{name}", doc, QUALITY_LABELS, registry=r)
            for name, doc in QUALITY_DOCS.items()
        }

    def _restore(self, totals: RunTotals) -> None:
        """Counters from the checkpoint; its age from its file's modification time."""
        self.advance(
            examples=totals.examples,
            steps=totals.step,
            dead_letters=totals.dead_letters,
        )
        if totals.checkpoint is not None:
            self._checkpoint_step.set(totals.step)
            age = max(0.0, time.time() - os.stat(totals.checkpoint).st_mtime)
            self._checkpoint_at = time.monotonic() - age

    def advance(self, **totals: int) -> None:
        """Bring the counters up to these run-wide totals (never backwards)."""
        for name, total in totals.items():
            delta = total - self._totals[name]
            if delta > 0:
                self._counters[name].inc(delta)
                self._totals[name] = total

    def checkpoint_written(self, step: int) -> None:
        """A checkpoint is durable: its age restarts from 0."""
        self._checkpoint_at = time.monotonic()
        self._checkpoint_step.set(step)

    def checkpoint_failed(self) -> None:
        """A checkpoint write failed (the age keeps growing)."""
        self._checkpoint_failures.inc()

    def watch_consumer(self, topic: str, lag: Callable[[], Mapping[int, int]]) -> None:
        """Export ``lag()`` (partition → records) for ``topic`` at every scrape."""
        self._lag.watch(topic, lag)

    def watch_gaps(self, topic: str, records: Callable[[], int]) -> None:
        """Export ``records()``, the run's gap offsets of ``topic``, at every scrape."""
        self._gaps.watch(topic, records)

    def set(self, name: str, value: float) -> None:
        """Set ``examples_per_second`` or ``loss``."""
        self._gauges[name].set(value)

    def set_quality(self, scope: str, table: Mapping[str, Mapping[str, float]]) -> None:
        """NE / AUC / calibration per ``"domain/objective"`` key of ``table``."""
        for key, values in table.items():
            domain, objective = key.split("/")
            for name, gauge in self._quality.items():
                gauge.labels(domain, objective, scope).set(values[name])

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
