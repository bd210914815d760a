"""The daemon against damaged state and hostile bytes, on a real broker.

Faults injected: one flipped bit in an embedding table of the newest
checkpoint, a truncated checkpoint, every checkpoint corrupt, corrupt files
newer than the good one (rotation), a flipped byte in an example message, a
5 MB garbage message (whole and truncated dead letters), and a full disk for
the checkpoint directory (a real tmpfs of a few MB, mounted by the test: it
runs as root; without the right to mount those tests are skipped).

Each fault is counted: records trained against records on the topic, from the
checkpoint lineage (``GEM_DAEMON_APPLIED_LOG``), so nothing lost and nothing
applied twice is checked, not assumed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from features.kafka import KafkaSettings
from features.kafka.topics import topic_records
from tests.example_feed import PER_MESSAGE, ExampleFeed, Sent
from tests.test_daemon import applied_chain
from tests.test_daemon_faults import (
    REPO,
    daemon_command,
    finish,
    newest_step,
    start,
    wait_for,
)
from trainer.training.checkpoint import (
    CORRUPT_SUFFIX,
    CheckpointWriteError,
    list_checkpoints,
    load_latest,
    save_checkpoint,
)
from trainer.training.daemon import run_daemon_until_drained
from trainer.training.exits import EXIT_NO_CHECKPOINT

FIVE_MB = 5 * 1024 * 1024


def run_to_drain(
    settings: KafkaSettings, topic: str, group: str, directory: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """One bounded daemon run as a process (applied-offsets log on)."""
    environment = {
        **os.environ,
        "GEM_DAEMON_APPLIED_LOG": str(directory / "applied.jsonl"),
    }
    command = daemon_command(
        settings, topic, group, directory, "--checkpoint-every", "2",
        "--idle-seconds", "2", *extra,
    )  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "trainer.daemon", *command],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def drain_in_process(
    feed: ExampleFeed, topic: str, group: str, directory: Path
) -> dict[str, Any]:
    """One daemon run in this process on the tiny preset, until ``topic`` has
    been idle two seconds; its summary."""
    return run_daemon_until_drained(
        feed.settings, topic, group, directory / "ckpt", idle_seconds=2.0, preset="tiny"
    )


def assert_lineage_holds_each_once(
    directory: Path, checkpoints: Path, sent: Sent, steps: int
) -> dict[str, Any]:
    """The applied-offsets log under ``directory`` along the surviving lineage
    of ``checkpoints`` holds each record ``sent`` once, and the newest
    checkpoint is at ``steps`` steps of as many records; its state."""
    assert sorted(applied_chain(directory / "applied.jsonl", checkpoints)) == (
        sorted(sent)
    )
    loaded = load_latest(checkpoints)
    assert loaded is not None
    state = loaded[0]
    assert (state["step"], state["records"]) == (steps, steps)
    return state


def flip_bit_in_embedding_table(path: Path) -> str:
    """Flip one bit inside the largest embedding table's bytes; its name."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    name, table = max(
        (
            (k, v)
            for k, v in state["model"].items()
            if "embedding" in k and v.dim() == 2 and v.is_floating_point()
        ),
        key=lambda kv: kv[1].numel(),
    )
    raw = table.contiguous().numpy().tobytes()
    data = bytearray(path.read_bytes())
    start_at = data.find(raw[:256])
    assert start_at >= 0
    assert data.find(raw[:256], start_at + 1) < 0
    data[start_at + len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    return name


def committed_offset(settings: KafkaSettings, topic: str, group: str) -> int | None:
    from kafka import TopicPartition

    consumer = settings.consumer(group_id=group, enable_auto_commit=False)
    try:
        result: int | None = consumer.committed(TopicPartition(topic, 0))
        return result
    finally:
        consumer.close()


# ---- checkpoints: verified on load ---------------------------------------


@pytest.mark.parametrize("damage", ["bit flip in an embedding table", "truncation"])
def test_damaged_newest_checkpoint_falls_back_exactly_once(
    damage: str,
    feed: ExampleFeed,
    tmp_path: Path,
) -> None:
    values = feed.messages(20)
    topic, sent = feed.topic(values[:10], 1)
    first = run_to_drain(feed.settings, topic, "g-damage", tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    newest = list_checkpoints(tmp_path / "ckpt")[-1]
    assert newest.name == "ckpt-0000000010.pt"
    if damage == "truncation":
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
        what = "unreadable"
    else:
        what = flip_bit_in_embedding_table(newest)
    sent += feed.publish(topic, values[10:], 1)

    second = run_to_drain(feed.settings, topic, "g-damage", tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"checkpoint {newest}" in second.stderr
    assert what in second.stderr
    assert "resumed from" in second.stderr
    assert "ckpt-0000000008.pt" in second.stderr
    assert newest.with_name(newest.name + CORRUPT_SUFFIX).exists()
    # Records 8 and 9 were applied in the lost checkpoint and again after the
    # fall-back: the surviving lineage holds each record of the topic once.
    state = assert_lineage_holds_each_once(tmp_path, tmp_path / "ckpt", sent, 20)
    assert state["examples"] == 20 * PER_MESSAGE


def test_every_checkpoint_corrupt_refuses_then_start_fresh_trains_all(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    topic, sent = feed.topic(feed.messages(6), 1)
    first = run_to_drain(feed.settings, topic, "g-refuse", tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    # A clean exit sends the last group commit.
    assert committed_offset(feed.settings, topic, "g-refuse") == 6
    for path in list_checkpoints(tmp_path / "ckpt"):
        flip_bit_in_embedding_table(path)

    refused = run_to_drain(feed.settings, topic, "g-refuse", tmp_path)
    assert refused.returncode == EXIT_NO_CHECKPOINT
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "python -m trainer.daemon: error: refusing to start: none of the 3"
    )
    assert "--start-fresh" in last
    assert "resumed from" not in refused.stderr

    again = run_to_drain(feed.settings, topic, "g-refuse", tmp_path)
    # The corrupt files, set aside, still count.
    assert again.returncode == EXIT_NO_CHECKPOINT

    fresh = run_to_drain(feed.settings, topic, "g-refuse", tmp_path, "--start-fresh")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    loaded = load_latest(tmp_path / "ckpt")
    assert loaded is not None
    # A new model reads the topic from its start, not from the group's commit.
    assert (loaded[0]["step"], loaded[0]["records"]) == (6, 6)
    assert len(sent) == 6


def test_rotation_keeps_the_checkpoint_it_wrote_beside_corrupt_newer_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def state(step: int) -> dict[str, object]:
        weights = {"w": torch.full((4,), float(step))}
        return {"model": weights, "optimizer": {}, "step": step, "offsets": {}}

    save_checkpoint(tmp_path, state(5))
    for step in (100, 101, 102):
        (tmp_path / f"ckpt-{step:010d}.pt").write_bytes(os.urandom(300))
    written = save_checkpoint(tmp_path, state(6), keep=3)
    assert written.exists()
    loaded = load_latest(tmp_path)
    assert loaded is not None
    assert loaded[0]["step"] == 6
    # The daemon's way: corrupt files are set aside on load, then rotation
    # keeps the good ones.
    with caplog.at_level(logging.WARNING):
        assert load_latest(tmp_path, set_aside=True) is not None
    assert "ckpt-0000000102.pt" in caplog.text
    for step in (7, 8, 9):
        save_checkpoint(tmp_path, state(step), keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt-0000000008.pt",
        "ckpt-0000000009.pt",
    ]
    # ckpt-100 went in the first rotation (the oldest beside the new one).
    assert len(list(tmp_path.glob(f"*{CORRUPT_SUFFIX}"))) == 2


def test_a_missing_manifest_or_a_changed_offset_is_caught(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = {"model": {"w": torch.ones(3)}, "optimizer": {}, "step": 1}
    path = save_checkpoint(tmp_path, {**state, "offsets": {"0": 41}})
    unverifiable = tmp_path / "ckpt-0000000002.pt"
    torch.save({**state, "offsets": {"0": 41}}, unverifiable)
    with caplog.at_level(logging.WARNING):
        loaded = load_latest(tmp_path)
    assert loaded is not None
    assert loaded[1] == path
    assert "no integrity manifest" in caplog.text
    unverifiable.unlink()
    # The offset changes, the manifest stays: the values' checksum fails.
    raw = torch.load(path, weights_only=True)
    raw["offsets"]["0"] = 42
    torch.save(raw, path)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert load_latest(tmp_path) is None
    assert "offsets or config fail their checksum" in caplog.text


# ---- example messages: hostile bytes -------------------------------------


def test_flipped_byte_and_five_megabytes_of_garbage_are_set_aside(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    """The dead-letter topic allows 1 MB: the 5 MB letter is stored truncated,
    with the original's length and hash; the daemon goes on, and a restart
    goes past it."""
    from kafka.admin import NewTopic

    topic = feed.new_topic(1)
    admin = feed.settings.admin()
    admin.create_topics(
        [
            NewTopic(
                name=f"{topic}.dead-letter",
                num_partitions=1,
                replication_factor=1,
                topic_configs={"max.message.bytes": "1048576"},
            )
        ]
    )
    admin.close()
    good = feed.messages(8)
    flipped = bytearray(good[3])
    flipped[len(flipped) // 2] ^= 0x04
    garbage = os.urandom(FIVE_MB)
    feed.publish(topic, [*good[:3], bytes(flipped), garbage, *good[4:7]], 1)
    first = drain_in_process(feed, topic, "g-hostile", tmp_path)
    assert (first["step"], first["dead_letters"], first["offsets"]) == (6, 2, {0: 8})

    letters = {
        m.offset: m for m in topic_records(feed.settings, f"{topic}.dead-letter")
    }
    assert sorted(letters) == [0, 1]
    headers = [dict(letters[i].headers) for i in (0, 1)]
    assert headers[0]["dead-letter-offset"] == b"3"
    assert b"checksum mismatch" in headers[0]["dead-letter-reason"]
    assert letters[0].value == bytes(flipped)
    assert headers[0]["dead-letter-truncated"] == b"false"
    assert headers[1]["dead-letter-offset"] == b"4"
    assert headers[1]["dead-letter-truncated"] == b"true"
    assert headers[1]["dead-letter-payload-length"] == str(FIVE_MB).encode()
    digest = hashlib.sha256(garbage).hexdigest().encode()
    assert headers[1]["dead-letter-payload-sha256"] == digest
    assert 0 < len(letters[1].value) < 1024 * 1024
    assert garbage.startswith(letters[1].value)

    feed.publish(topic, [good[7]], 1)
    second = drain_in_process(feed, topic, "g-hostile", tmp_path)
    # Counted over the whole run: the restart does not count from zero.
    assert (second["step"], second["dead_letters"], second["records"]) == (7, 2, 9)
    assert second["offsets"] == {0: 9}


def test_five_megabytes_of_garbage_are_dead_lettered_whole(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    topic = feed.new_topic(1)
    garbage = os.urandom(FIVE_MB)
    good = feed.messages(3)
    feed.publish(topic, [good[0], garbage, *good[1:]], 1)
    result = drain_in_process(feed, topic, "g-whole", tmp_path)
    assert (result["step"], result["dead_letters"]) == (3, 1)
    (letter,) = topic_records(feed.settings, f"{topic}.dead-letter")
    assert letter.value == garbage
    assert dict(letter.headers)["dead-letter-truncated"] == b"false"


# ---- a full disk ----------------------------------------------------------


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs mounted at ``tmp_path/ckpt`` (a real ENOSPC)."""
    mount_point = tmp_path / "ckpt"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(filesystem: Path, leave: int) -> Path:
    """Take all the free space of ``filesystem`` but ``leave`` bytes."""
    filler = filesystem / "filler"
    with open(filler, "wb", buffering=0) as file:
        try:
            while file.write(b"\0" * (1 << 16)):
                pass
        except OSError:
            pass  # full: the point
    with open(filler, "r+b") as file:
        file.truncate(max(0, filler.stat().st_size - leave))
    return filler


def test_full_disk_frees_older_checkpoints_and_keeps_the_newest(
    small_filesystem: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def state(step: int) -> dict[str, object]:
        weights = {"w": torch.full((256 * 1024,), float(step))}  # 1 MB
        return {"model": weights, "optimizer": {}, "step": step, "offsets": {}}

    for step in (1, 2, 3):
        save_checkpoint(small_filesystem, state(step))
    filler = fill(small_filesystem, leave=256 * 1024)
    with caplog.at_level(logging.WARNING):
        save_checkpoint(small_filesystem, state(4))
    assert "is full" in caplog.text
    assert [p.name for p in list_checkpoints(small_filesystem)] == [
        "ckpt-0000000003.pt",
        "ckpt-0000000004.pt",
    ]
    filler.unlink()
    filler = fill(small_filesystem, leave=256 * 1024)
    save_checkpoint(small_filesystem, state(5), keep=1)  # frees ckpt-3, then ckpt-4
    filler.unlink()
    fill(small_filesystem, leave=256 * 1024)
    with pytest.raises(CheckpointWriteError, match=r"ckpt-0000000005\.pt is kept"):
        save_checkpoint(small_filesystem, state(6), keep=1)  # nothing to free
    loaded = load_latest(small_filesystem)
    assert loaded is not None
    assert loaded[0]["step"] == 5
    assert not list(small_filesystem.glob(".*.tmp"))


def test_full_disk_keeps_the_newest_good_checkpoint_not_a_corrupt_one(
    small_filesystem: Path,
) -> None:
    weights = {"w": torch.zeros(256 * 1024)}  # 1 MB
    for step in (1, 2):
        save_checkpoint(
            small_filesystem,
            {"model": weights, "optimizer": {}, "step": step, "offsets": {}},
        )
    (small_filesystem / "ckpt-0000000003.pt").write_bytes(os.urandom(1 << 20))
    fill(small_filesystem, leave=256 * 1024)
    save_checkpoint(
        small_filesystem, {"model": weights, "optimizer": {}, "step": 4, "offsets": {}}
    )
    assert [p.name for p in list_checkpoints(small_filesystem)] == [
        "ckpt-0000000002.pt",
        "ckpt-0000000004.pt",
    ]


def test_daemon_on_a_full_disk_keeps_its_last_checkpoint_and_says_so(
    feed: ExampleFeed,
    tmp_path: Path,
    small_filesystem: Path,
) -> None:
    values = feed.messages(12)
    topic, sent = feed.topic(values[:4], 1)
    args = daemon_command(
        feed.settings, topic, "g-full", tmp_path, "--checkpoint-every", "2",
        "--keep", "1", "--idle-seconds", "600",
    )  # fmt: skip
    process = start(args, tmp_path)
    assert wait_for(lambda: newest_step(tmp_path) == 4, process, 90)
    kept = list_checkpoints(small_filesystem)[-1]
    filler = fill(small_filesystem, leave=kept.stat().st_size // 4)
    sent += feed.publish(topic, values[4:8], 1)
    log_path = tmp_path / "daemon.log"
    assert wait_for(lambda: "NOT written" in log_path.read_text(), process, 90)
    process.send_signal(signal.SIGTERM)
    assert finish(process, 60) == 3
    text = log_path.read_text()
    assert f"the last checkpoint {kept.name} is kept" in text
    last = text.strip().splitlines()[-1]
    assert "could not be written" in last
    assert f"{kept.name}, is kept" in last
    assert [p.name for p in list_checkpoints(small_filesystem)] == [kept.name]
    assert not list(small_filesystem.glob(".*.tmp"))
    loaded = load_latest(small_filesystem)
    assert loaded is not None
    assert loaded[0]["step"] == 4

    filler.unlink()
    sent += feed.publish(topic, values[8:], 1)
    rest = run_to_drain(feed.settings, topic, "g-full", tmp_path, "--keep", "1")
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert f"resumed from {kept}" in rest.stderr
    assert_lineage_holds_each_once(tmp_path, small_filesystem, sent, 12)


def test_metrics_endpoint_listens_on_loopback_by_default() -> None:
    import urllib.request

    from trainer.metrics.reporting import Reporter

    reporter = Reporter(prometheus_port=_free_port())
    try:
        assert reporter.prometheus_address == "127.0.0.1"
        url = f"http://127.0.0.1:{reporter.prometheus_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert b"gem_trainer_step" in response.read()
    finally:
        reporter.close()
    wide = Reporter(prometheus_port=_free_port(), prometheus_address="0.0.0.0")
    try:
        assert wide.prometheus_address == "0.0.0.0"
    finally:
        wide.close()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_hostile_teacher_outputs_get_a_reason() -> None:
    import numpy as np
    import pyarrow as pa

    from trainer.distill.records import (
        NUM_LOGITS,
        decode_teacher_message,
        encode_teacher_message,
        teacher_output_table,
    )

    table = teacher_output_table(
        pa.array(["a", "b"]),
        np.array([1, 2], np.int64),
        np.full((2, NUM_LOGITS), np.nan, np.float32),
        np.zeros((2, 4), np.float32),
        step=1,
        teacher_time_ms=5,
    )
    data = encode_teacher_message(table)
    assert decode_teacher_message(data)[1] == "teacher-output teacher_logits not finite"
    for position in range(len(data)):
        flipped = bytearray(data)
        flipped[position] ^= 0x01
        rows, reason = decode_teacher_message(bytes(flipped))
        assert rows is None
        assert reason
    assert decode_teacher_message(b"")[0] is None


def test_resume_state_refuses_only_a_directory_of_unusable_checkpoints(
    tmp_path: Path,
) -> None:
    from trainer.training.checkpoint import NoUsableCheckpointError, resume_state

    assert resume_state(tmp_path / "missing") is None
    (tmp_path / "progressive_ne.png").write_bytes(b"\x89PNG")
    (tmp_path / ".ckpt-0000000003.pt.99.tmp").write_bytes(b"half")
    assert resume_state(tmp_path) is None  # no checkpoint was ever finished
    (tmp_path / "ckpt-0000000004.pt").write_bytes(b"torn")
    with pytest.raises(NoUsableCheckpointError, match="--start-fresh"):
        resume_state(tmp_path)
    assert (tmp_path / f"ckpt-0000000004.pt{CORRUPT_SUFFIX}").exists()
    with pytest.raises(NoUsableCheckpointError):
        resume_state(tmp_path)  # set aside, it still says the run had state
    assert resume_state(tmp_path, start_fresh=True) is None


def test_the_student_rejects_teacher_rows_of_another_width() -> None:
    import numpy as np
    import pyarrow as pa

    from trainer.distill.records import (
        NUM_LOGITS,
        encode_teacher_message,
        teacher_output_table,
    )
    from trainer.distill.teacher_cache import teacher_decoder

    table = teacher_output_table(
        pa.array(["a"]),
        np.array([1], np.int64),
        np.zeros((1, NUM_LOGITS), np.float32),
        np.zeros((1, 8), np.float32),
        step=1,
        teacher_time_ms=5,
    )
    data = encode_teacher_message(table)
    assert teacher_decoder(8)(data, [])[1] is None
    assert teacher_decoder(4)(data, [])[1] == (
        "teacher embedding width 8, the teacher's is 4"
    )
