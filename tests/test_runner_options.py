"""A runner's own options reach it: Beam's Flink job server (an embedded
Flink, ``make flink``) describes ``checkpointing_interval`` and the rest of
Flink's options, the job's check accepts them and refuses a misspelled one
in one line before anything runs, and Beam sends the accepted ones with the
job."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_job_api_pb2_grpc
from apache_beam.runners.portability.portable_runner import JobServiceHandle

from launchers.flink_job_server import FlinkJobServer
from pipelines.beam.runner import (
    RunnerOptionError,
    check_runner_options,
    described_options,
    passed_through,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlinkJobServer]:
    log = tmp_path_factory.mktemp("flink") / "flink.log"
    with FlinkJobServer(log_path=log) as running:
        yield running


def test_the_job_server_describes_flink_s_options(server: FlinkJobServer) -> None:
    described = described_options(server.endpoint)
    assert {
        "checkpointing_interval",
        "savepoint_path",
        "externalized_checkpoints_enabled",
        "state_backend_storage_path",
    } <= described


def test_a_flink_option_is_accepted_and_sent_with_the_job(
    server: FlinkJobServer,
) -> None:
    import grpc

    options = PipelineOptions(
        [*server.beam_flags(), "--checkpointing_interval=5000", "--savepoint_path=/s"]
    )
    assert passed_through(options) == ["checkpointing_interval", "savepoint_path"]
    check_runner_options(options)
    # What Beam's portable runner sends the job server with the job.
    with grpc.insecure_channel(server.endpoint) as channel:
        handle = JobServiceHandle(
            beam_job_api_pb2_grpc.JobServiceStub(channel), options
        )
        sent = handle.get_pipeline_options()
    # Flink's job server parses each value from its text.
    assert str(sent["beam:option:checkpointing_interval:v1"]) == "5000"
    assert sent["beam:option:savepoint_path:v1"] == "/s"


def test_a_misspelled_flink_option_is_refused_before_the_job(
    server: FlinkJobServer, tmp_path: Path
) -> None:
    options = PipelineOptions([*server.beam_flags(), "--checkpointing_intervall=5"])
    with pytest.raises(RunnerOptionError) as refused:
        check_runner_options(options)
    assert str(refused.value) == (
        "unrecognized arguments: --checkpointing_intervall: neither Beam nor "
        f"the job server at {server.endpoint} knows it (did you mean "
        "--checkpointing_interval?)"
    )
