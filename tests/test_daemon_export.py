"""The trainer daemon's serving exports (``--artifacts``): a checkpoint becomes
a serving version beside the run, whose manifest names the step and the
Kafka offsets that checkpoint was trained to; export flags without a root
are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from features.serving_artifacts import (
    GEM_MODEL,
    VERSIONS,
    current_version,
    list_versions,
    load_manifest,
)
from tests.example_feed import ExampleFeed
from trainer import daemon as daemon_command
from trainer.export.periodic import HOLD_DIR
from trainer.training.daemon import DaemonConfig, run
from trainer.training.run_config import DaemonConfig as FlagsConfig


def test_the_daemon_exports_a_checkpoint_as_a_serving_version(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    topic, _ = feed.topic(feed.messages(12), 1)
    artifacts = tmp_path / "artifacts"
    config = DaemonConfig(
        topic=topic,
        group="g-export",
        checkpoint_dir=tmp_path / "ckpt",
        preset="tiny",
        idle_seconds=2.0,
        checkpoint_every=2,
        artifacts=artifacts,
        export_every_steps=4,
        keep_versions=2,
    )
    result = run(config, feed.settings)
    # Training went on while the export ran: every message was applied.
    assert result["step"] == 12
    model_dir = artifacts / GEM_MODEL
    versions = list_versions(model_dir)
    assert 1 <= len(versions) <= 2
    current = current_version(model_dir)
    assert current in versions
    manifest = load_manifest(model_dir / VERSIONS / str(current))
    step = manifest.trained_to["step"]
    assert step in range(2, 13, 2)  # one of the run's checkpoints
    # One partition, one message per step: offset and step agree.
    assert manifest.trained_to["offsets"] == {"0": step}
    assert manifest.model_config["preset"] == "tiny"
    # The checkpoint held for the export is let go once it is done.
    assert not any((tmp_path / "ckpt" / HOLD_DIR).iterdir())


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--export-every-steps", "5"], "--export-every-steps without --artifacts"),
        (["--export-every-minutes", "1"], "--export-every-minutes without --artifacts"),
    ],
)
def test_an_export_cadence_without_a_root_is_refused(
    flags: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--kafka-bootstrap", "127.0.0.1:9", "--topic", "t"]
    argv += ["--checkpoint-dir", str(tmp_path / "ckpt"), *flags]
    assert daemon_command.main(argv) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()


def test_artifacts_alone_export_every_ten_minutes(tmp_path: Path) -> None:
    config = FlagsConfig(topic="t", checkpoint_dir=tmp_path, artifacts=tmp_path / "a")
    export = config.periodic_export()
    assert export is not None
    assert (export.every_steps, export.every_seconds, export.keep) == (None, 600.0, 3)
    assert FlagsConfig(topic="t", checkpoint_dir=tmp_path).periodic_export() is None
