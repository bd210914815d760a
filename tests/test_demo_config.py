"""The settings of the demo and broker commands come from their flags: each
flag lands on its config field, and the names a demo passes on to the trainer
are the trainer's."""

from __future__ import annotations

import argparse
from pathlib import Path

from demos import end_to_end
from demos.demo_config import PRESET_NAMES, DemoConfig
from demos.stream.config import RUN_FLAGS, StreamDemoConfig
from features.config_flags import add_config_flags, config_fields
from launchers.kafka_broker import BrokerCommandConfig
from launchers.kafka_broker import build_parser as broker_parser
from trainer.training.run_config import PRESET_NAMES as TRAINER_PRESET_NAMES


def test_demo_presets_are_the_trainers() -> None:
    assert PRESET_NAMES == TRAINER_PRESET_NAMES


def test_demo_flags_set_its_config() -> None:
    parser = end_to_end.build_parser()
    assert DemoConfig(**config_fields(parser.parse_args([]), DemoConfig)) == (
        DemoConfig()
    )
    args = parser.parse_args(
        ["--users", "10", "--rate", "50", "--output", "out", "--require-learning"]
    )
    config = DemoConfig(**config_fields(args, DemoConfig))
    assert (config.users, config.rate, config.output) == (10, 50.0, Path("out"))
    assert config.require_learning
    assert DemoConfig().rate is None


def _stream(argv: list[str], only: tuple[str, ...] | None = None) -> StreamDemoConfig:
    parser = argparse.ArgumentParser()
    add_config_flags(parser, StreamDemoConfig, only=only)
    return StreamDemoConfig(**config_fields(parser.parse_args(argv), StreamDemoConfig))


def test_stream_demo_flags_set_its_config() -> None:
    assert _stream([]) == StreamDemoConfig()
    assert StreamDemoConfig().trainer
    assert not _stream(["--no-trainer"]).trainer
    config = _stream(["--days", "1", "--broker-down-seconds", "0"], only=RUN_FLAGS)
    assert (config.days, config.broker_down_seconds, config.trainer) == (1, 0.0, True)


def test_broker_flags_set_its_config() -> None:
    args = broker_parser().parse_args(
        ["--topic", "a:3", "--topic", "b", "--sasl-user", "u:pw", "--log", "x.log"]
    )
    config = BrokerCommandConfig(**config_fields(args, BrokerCommandConfig))
    assert config.topics == [("a", 3), ("b", 1)]
    assert config.sasl_users == [("u", "pw")]
    assert config.log_path == Path("x.log")
    assert (config.port, config.home) == (None, None)
    assert BrokerCommandConfig(
        **config_fields(broker_parser().parse_args([]), BrokerCommandConfig)
    ) == BrokerCommandConfig(topics=[], sasl_users=[])
