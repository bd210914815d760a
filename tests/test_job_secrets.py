"""No password travels in a Beam job: the streaming job's graph, built with
SASL settings and the prod Feast configuration, is serialized as a runner
gets it, each DoFn unpickled and pickled again in the clear, and no secret
is found there nor in the options sent with it. The workers read each one
where it lives when they open a client."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import apache_beam as beam
import cloudpickle
import pytest
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

from features import feast_repository
from features.kafka import KafkaSettings
from features.kafka.secrets import PASSWORD_ENV, SSL_PASSWORD_ENV, Secret
from pipelines.beam.options import GemBuildOptions, kafka_settings
from pipelines.streaming.feast_push import PushTarget
from pipelines.streaming.job import (
    StreamingOptions,
    _add_stages,
    _Job,
    stream_config,
)

KAFKA_SECRET = "kafka-secret-4f1c"
REDIS_SECRET = "redis-secret-9a2e"
POSTGRES_SECRET = "pg-secret-77d0"
SECRETS = (KAFKA_SECRET, REDIS_SECRET, POSTGRES_SECRET)


@pytest.fixture(autouse=True)
def _restored_password_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher puts a flag's password into this process's environment
    (``export_secrets``): set back after each test, so later tests' clients
    read their own."""
    for name in (PASSWORD_ENV, SSL_PASSWORD_ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


@pytest.fixture
def prod_feast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(feast_repository.ENV_VAR, "prod")
    monkeypatch.setenv(
        feast_repository.REDIS_VAR, f"127.0.0.1:6379,password={REDIS_SECRET}"
    )
    monkeypatch.setenv(
        feast_repository.REGISTRY_URL_VAR,
        f"postgresql+psycopg://gem:{POSTGRES_SECRET}@127.0.0.1:5432/gem",
    )
    monkeypatch.delenv(PASSWORD_ENV, raising=False)


def _client_properties(path: Path) -> Path:
    path.write_text(
        "bootstrap.servers=127.0.0.1:9092\n"
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
        f'required username="alice" password="{KAFKA_SECRET}";\n'
    )
    return path


def _graph(flags: list[str]) -> tuple[PipelineOptions, beam.Pipeline]:
    """The streaming job's graph as :func:`pipelines.streaming.job.run`
    builds it (the stores are not opened: building needs none)."""
    options = PipelineOptions(flags)
    options.view_as(StandardOptions).streaming = True
    build = options.view_as(GemBuildOptions)
    stream = options.view_as(StreamingOptions)
    job = _Job(
        build=build,
        stream=stream,
        settings=kafka_settings(build),
        config=stream_config(options),
        dead_topic="events.dead-letter",
        target=PushTarget(
            "prod",
            None,
            None,
            None,
            {"user_counters": "user_counters_push"},
        ),
    )
    pipeline = beam.Pipeline(runner="PrismRunner", options=options)
    _add_stages(pipeline, job, examples_partitions=4)
    return options, pipeline


def _dofns(proto: beam_runner_api_pb2.Pipeline) -> Iterator[object]:
    """Every ParDo's DoFn, unpickled as a worker unpickles it."""
    for transform in proto.components.transforms.values():
        if transform.spec.urn != common_urns.primitives.PAR_DO.urn:
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
        yield pickler.loads(payload.do_fn.payload)


def _secrets_in(blob: bytes) -> list[str]:
    return [secret for secret in SECRETS if secret.encode() in blob]


def _settings_in(dofns: list[object]) -> list[KafkaSettings]:
    found = []
    for fn in dofns:
        stack = [fn]
        while stack:
            item = stack.pop()
            if isinstance(item, KafkaSettings):
                found.append(item)
            elif isinstance(item, tuple | list):
                stack.extend(item)
            elif hasattr(item, "__dict__") and not isinstance(item, type):
                stack.extend(vars(item).values())
    return found


@pytest.mark.parametrize("how", ["config file", "flag"])
def test_the_job_graph_holds_no_secret(
    prod_feast: None, tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _client_properties(tmp_path / "client.properties")
    flags = [
        "--streaming",
        f"--input={tmp_path}",
        "--events-topic=events",
        "--examples-topic=examples",
        "--feast-env=prod",
        f"--kafka-config={config}",
    ]
    if how == "flag":
        flags += ["--kafka-sasl-password", KAFKA_SECRET]
    options, pipeline = _graph(flags)
    proto = pipeline.to_runner_api()
    assert not _secrets_in(proto.SerializeToString())
    dofns = list(_dofns(proto))
    assert len(dofns) >= 6
    for fn in dofns:
        assert not _secrets_in(cloudpickle.dumps(fn)), fn
    # The runner is sent the options too.
    sent = options.get_all_options(retain_unknown_options=True)
    assert not _secrets_in(json.dumps(sent, default=str).encode())
    # What the DoFns hold instead: where the password is, read on the worker.
    settings = _settings_in(dofns)
    assert settings
    for found in settings:
        assert found.sasl_password is not None
        assert found.sasl_password.value is None
        assert found.consumer_config()["sasl_plain_password"] == KAFKA_SECRET
    where = {found.sasl_password for found in settings if found.sasl_password}
    if how == "flag":
        # This process's local workers read the launcher's environment.
        assert where == {Secret(env=PASSWORD_ENV)}
    else:
        assert where == {
            Secret(properties_file=str(config), property="sasl.jaas.config")
        }
    # A worker whose environment lacks it says where it looked, in one line.
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    if how == "flag":
        with pytest.raises(ValueError, match=f"\\${PASSWORD_ENV} is not set"):
            settings[0].consumer_config()


def test_a_pickled_password_keeps_only_where_it_is(tmp_path: Path) -> None:
    secret = Secret(env=PASSWORD_ENV, value=KAFKA_SECRET)
    blob = pickle.dumps(secret)
    assert KAFKA_SECRET.encode() not in blob
    assert pickle.loads(blob) == Secret(env=PASSWORD_ENV)
    path = tmp_path / "password"
    path.write_text(f"{KAFKA_SECRET}\n")
    assert pickle.loads(pickle.dumps(Secret(file=str(path)))).read() == KAFKA_SECRET
