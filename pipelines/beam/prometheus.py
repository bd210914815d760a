"""The ``/metrics`` endpoint (``prometheus_client``) of a job whose workers
run in its own process.

Beam's metrics reach an operator through the runner (Flink's and Dataflow's
metric systems, the job's result). Where the SDK worker is the job's own
process (``--environment_type=LOOPBACK``: Prism's default, and the local
Flink job server's tests) the DoFns can also feed a Prometheus registry that
the job serves: :data:`REGISTRY`, one per process, which every DoFn instance
of the process shares (:func:`gauge`, :func:`histogram`). On a remote worker
the same calls fill a registry nobody serves, at the cost of a dictionary
update.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions
from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from pipelines.beam.runner import runner_name

REGISTRY: Final = CollectorRegistry()
"""The job's own registry: nothing else of the process appears on /metrics."""
LOOPBACK: Final = "LOOPBACK"
_PRISM: Final = frozenset({"PrismRunner", "DirectRunner", "SwitchingDirectRunner"})
_lock = threading.Lock()
_metrics: dict[str, Any] = {}


def gauge(name: str, doc: str) -> Gauge:
    """The process's gauge ``name`` (made on first use)."""
    with _lock:
        if name not in _metrics:
            _metrics[name] = Gauge(name, doc, registry=REGISTRY)
        found: Gauge = _metrics[name]
        return found


def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
    """The process's histogram ``name`` (made on first use)."""
    with _lock:
        if name not in _metrics:
            _metrics[name] = Histogram(name, doc, buckets=buckets, registry=REGISTRY)
        found: Histogram = _metrics[name]
        return found


def runs_in_this_process(options: PipelineOptions) -> bool:
    """The SDK worker is this process: a loopback environment (Prism's
    default when none is named)."""
    environment = options.view_as(PortableOptions).environment_type
    if environment is None:
        return runner_name(options) in _PRISM
    return str(environment).upper() == LOOPBACK


class MetricsEndpoint:
    """``/metrics`` of :data:`REGISTRY` on ``address:port`` until :meth:`close`."""

    def __init__(self, port: int, address: str = "127.0.0.1") -> None:
        server, thread = start_http_server(port, addr=address, registry=REGISTRY)
        self._server: Any = server
        self._thread = thread
        self.port: int = server.server_port

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


def serve_job_metrics(options: PipelineOptions, port: int) -> MetricsEndpoint | None:
    """Serve :data:`REGISTRY` on ``port`` (0: nothing) where the workers are
    this process.

    Raises:
        SystemExit: a port asked of a job whose workers run elsewhere (their
            registries are theirs; the runner's metrics are the way there).
    """
    if not port:
        return None
    if not runs_in_this_process(options):
        raise SystemExit(
            f"--metrics-port serves where the job's workers run in its own "
            f"process (--environment_type={LOOPBACK}); on --runner="
            f"{runner_name(options)} read the job's Beam metrics from the runner"
        )
    return MetricsEndpoint(port)
