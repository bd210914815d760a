"""The streaming job's ``/metrics`` endpoint: served where its workers are
its own process (a loopback environment), refused elsewhere in one line."""

from __future__ import annotations

import urllib.request

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.beam import prometheus


def test_a_loopback_job_serves_its_registry() -> None:
    options = PipelineOptions(["--runner=PrismRunner"])
    assert prometheus.serve_job_metrics(options, port=0) is None  # 0: none
    prometheus.gauge("gem_stream_test_gauge", "a gauge of this test").set(4.5)
    served = prometheus.MetricsEndpoint(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{served.port}/metrics") as r:
            text = r.read().decode()
    finally:
        served.close()
    assert "gem_stream_test_gauge 4.5" in text
    assert "python_gc" not in text  # the job's own registry only


@pytest.mark.parametrize(
    ("flags", "local"),
    [
        (["--runner=PrismRunner"], True),
        (["--runner=DirectRunner"], True),
        (["--runner=PortableRunner", "--environment_type=LOOPBACK"], True),
        (["--runner=PortableRunner", "--environment_type=DOCKER"], False),
        (["--runner=FlinkRunner"], False),
        (["--runner=DataflowRunner"], False),
    ],
)
def test_the_endpoint_is_where_the_workers_are(flags: list[str], local: bool) -> None:
    options = PipelineOptions(flags)
    assert prometheus.runs_in_this_process(options) is local
    if not local:
        with pytest.raises(SystemExit, match="--metrics-port serves where"):
            prometheus.serve_job_metrics(options, port=9999)
