"""Checkpointed offsets against the topic, and one writer per directory, on
the real embedded broker.

Faults: records removed by ``delete_records`` before they were trained (a
retention gap: stop, then continue with the gap counted and kept), a topic
deleted and created again under its name, a consumer group whose commit is
ahead of a new model, and a second daemon started on a running one's
checkpoint directory (refused; after a SIGKILL of the first, the lock is
free and the run ends with every record applied once). Records lost and
applied twice are counted from the checkpoint lineage, not assumed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from features.cli import CommandError
from features.directory_lock import (
    LOCK_NAME,
    DirectoryLock,
    DirectoryLockedError,
    claim_directory,
)
from features.kafka import KafkaSettings, ensure_topics
from tests.example_feed import ExampleFeed, Sent
from tests.test_daemon import applied_chain
from tests.test_daemon_faults import daemon_command, finish, start, wait_for
from tests.test_daemon_integrity import run_to_drain
from trainer.data.offset_check import (
    OffsetGapError,
    TopicChangedError,
    TopicView,
    check_offsets,
)
from trainer.training.checkpoint import list_checkpoints, load_latest
from trainer.training.daemon import run_daemon_until_drained
from trainer.training.exits import (
    EXIT_LOCKED,
    EXIT_OFFSET_GAP,
    EXIT_TOPIC_CHANGED,
)

pytestmark = pytest.mark.integration


def delete_below(
    settings: KafkaSettings, topic: str, partition: int, offset: int
) -> None:
    """What retention does: every record of ``partition`` below ``offset`` gone."""
    from kafka import TopicPartition

    admin = settings.admin()
    try:
        admin.delete_records({TopicPartition(topic, partition): offset})
    finally:
        admin.close()


def recreate(settings: KafkaSettings, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again, empty, under the same name."""
    from kafka.errors import TopicAlreadyExistsError

    admin = settings.admin()
    try:
        admin.delete_topics([topic])
    finally:
        admin.close()
    deadline = time.monotonic() + 30
    while True:
        try:
            ensure_topics(settings, {topic: partitions})
            return
        except TopicAlreadyExistsError:  # the deletion is still under way
            assert time.monotonic() < deadline
            time.sleep(0.2)


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_check_offsets_sees_gaps_and_refuses_a_changed_topic() -> None:
    view = TopicView("t", "id-1", earliest={0: 20, 1: 0}, end={0: 30, 1: 5})
    gaps = check_offsets(view, {0: 10, 1: 5}, "id-1")
    assert [(g.partition, g.start, g.stop, g.records) for g in gaps] == [
        (0, 10, 20, 10)
    ]
    # Silent on a partition the run reads: its removed records are a gap too.
    silent = check_offsets(view, {1: 5}, "id-1")
    assert [(g.partition, g.start, g.stop) for g in silent] == [(0, 0, 20)]
    assert check_offsets(view, {}, None) == []  # a new model has no gaps
    with pytest.raises(TopicChangedError, match="beyond its end: partition 1 at 9"):
        check_offsets(view, {0: 25, 1: 9}, "id-1")
    with pytest.raises(TopicChangedError, match="deleted and created again"):
        check_offsets(view, {0: 25}, "id-0")


def test_a_second_holder_is_refused_and_a_killed_one_frees_the_lock(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ckpt"
    with DirectoryLock(directory, "--checkpoint-dir"):
        with pytest.raises(DirectoryLockedError) as refused:
            DirectoryLock(directory, "--checkpoint-dir").acquire()
    assert f"is in use by pid {os.getpid()} on host" in str(refused.value)
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys, time, pathlib; from features.directory_lock import "
            "DirectoryLock; DirectoryLock(pathlib.Path(sys.argv[1]), '--x')"
            ".acquire(); print('held', flush=True); time.sleep(60)",
            str(directory),
        ],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == b"held"
    with pytest.raises(DirectoryLockedError, match=f"pid {holder.pid} "):
        DirectoryLock(directory, "--checkpoint-dir").acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    with DirectoryLock(directory, "--checkpoint-dir") as lock:
        assert lock.held
    assert (directory / LOCK_NAME).exists()


def test_an_output_folder_is_new_empty_or_the_commands_own(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not ours")
    with pytest.raises(CommandError, match=r"did not write \(notes\.txt\)"):
        claim_directory(foreign, ".mine", "--output")
    assert (foreign / "notes.txt").read_text() == "not ours"
    ours = tmp_path / "ours"
    claim_directory(ours, ".mine", "--output")
    (ours / "part-00000.parquet").write_bytes(b"x")
    (ours / "sub").mkdir()
    claim_directory(ours, ".mine", "--output")  # a re-run replaces its own
    assert sorted(p.name for p in ours.iterdir()) == [".mine"]
    (tmp_path / "file").write_text("")
    with pytest.raises(CommandError, match="is a file"):
        claim_directory(tmp_path / "file", ".mine", "--output")


def test_a_retention_gap_stops_the_daemon_then_continues_counted(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    topic, first = feed.topic(feed.messages(10), 1)
    trained = run_to_drain(feed.settings, topic, "g-gap", tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    later = feed.publish(topic, feed.messages(20), 1)
    delete_below(feed.settings, topic, 0, 20)  # offsets 10-19: never trained

    refused = run_to_drain(feed.settings, topic, "g-gap", tmp_path)
    assert refused.returncode == EXIT_OFFSET_GAP, refused.stderr[-3000:]
    assert last_line(refused) == (
        "python -m trainer.daemon: error: records of topic "
        f"{topic} were removed (retention or delete_records) before they were "
        "trained: 10 of partition 0 (offsets 10-19); pass --on-offset-gap "
        "continue to train on from the earliest kept records (the gap is "
        "counted and recorded in the checkpoint), or restore the records"
    )
    state = load_latest(tmp_path / "ckpt")
    assert state is not None
    assert state[0]["offsets"] == {"0": 10}

    resumed = run_to_drain(
        feed.settings, topic, "g-gap", tmp_path, "--on-offset-gap", "continue"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "OFFSET GAP: topic" in resumed.stderr
    kept = [record for record in later if record[1] >= 20]
    applied = applied_chain(tmp_path / "applied.jsonl", tmp_path / "ckpt")
    # Lost: exactly the 10 removed records; applied twice: none.
    assert sorted(applied) == sorted(first + kept)
    loaded = load_latest(tmp_path / "ckpt")
    assert loaded is not None
    final = loaded[0]
    assert final["offsets"] == {"0": 30}
    gaps = [
        (g["partition"], g["from"], g["to"], g["records"]) for g in final["offset_gaps"]
    ]
    assert gaps == [(0, 10, 20, 10)]
    assert final["topic_id"]


def test_a_recreated_topic_is_refused(feed: ExampleFeed, tmp_path: Path) -> None:
    topic, _ = feed.topic(feed.messages(6), 1)
    trained = run_to_drain(feed.settings, topic, "g-recreated", tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    recreate(feed.settings, topic, 1)
    feed.publish(topic, feed.messages(8), 1)  # more records than the checkpoint read
    refused = run_to_drain(feed.settings, topic, "g-recreated", tmp_path)
    assert refused.returncode == EXIT_TOPIC_CHANGED, refused.stderr[-3000:]
    line = last_line(refused)
    assert f"topic {topic} is not the topic the checkpoint was trained on" in line
    assert "point --checkpoint-dir at a new directory" in line
    assert len(list_checkpoints(tmp_path / "ckpt")) >= 1


def test_a_new_model_ignores_the_groups_commit_and_names_every_partition(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    from kafka import OffsetAndMetadata, TopicPartition

    topic = feed.new_topic(3)
    sent = feed.publish(topic, feed.messages(8), 2)  # partition 2 stays empty
    consumer = feed.settings.consumer(group_id="g-ahead", enable_auto_commit=False)
    consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(3, "", -1)})
    consumer.close()
    result = run_daemon_until_drained(
        feed.settings, topic, "g-ahead", tmp_path / "ckpt", idle_seconds=2.0,
        preset="tiny",
    )  # fmt: skip
    assert result["records"] == len(sent)  # partition 0 from 0, not from 3
    loaded = load_latest(tmp_path / "ckpt")
    assert loaded is not None
    assert loaded[0]["offsets"] == {"0": 4, "1": 4, "2": 0}


def test_a_second_daemon_on_the_directory_is_refused_until_the_first_dies(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    topic, sent = feed.topic(feed.messages(20), 2)
    args = daemon_command(
        feed.settings, topic, "g-two", tmp_path, "--checkpoint-every", "2"
    )
    first = start(args, tmp_path)  # unbounded: it runs until killed
    assert wait_for(lambda: bool(list_checkpoints(tmp_path / "ckpt")), first, 60)
    second = subprocess.run(
        [sys.executable, "-m", "trainer.daemon", *args],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert second.returncode == EXIT_LOCKED, second.stderr[-3000:]
    assert f"is in use by pid {first.pid} on host" in last_line(second)
    assert "python -m trainer.daemon" in last_line(second)
    first.kill()
    first.wait(10)
    again = start([*args, "--idle-seconds", "2"], tmp_path)
    assert finish(again, 120) == 0
    applied = applied_chain(tmp_path / "applied.jsonl", tmp_path / "ckpt")
    assert sorted(applied) == sorted(sent)  # nothing lost, nothing twice
    assert "taking over the lock of pid" in (tmp_path / "daemon.log").read_text()


def test_the_student_daemon_holds_its_directory_and_checks_its_offsets(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    from trainer.distill.student_daemon import run as run_student

    stream = feed.teacher_stream(tmp_path, 6)
    config = stream.student(tmp_path, idle_seconds=1.0, teacher_wait_s=0.2)
    with DirectoryLock(config.checkpoint_dir, "--checkpoint-dir"):
        with pytest.raises(DirectoryLockedError, match="is in use by pid"):
            run_student(config, feed.settings)
    first = run_student(config, feed.settings)
    assert first["messages"] == 6
    loaded = load_latest(config.checkpoint_dir)
    assert loaded is not None
    assert loaded[0]["offsets"] == {"0": 3, "1": 3}
    assert loaded[0]["topic_id"]
    assert loaded[0]["teacher_topic_id"]

    sent: Sent = feed.publish(stream.examples_topic, feed.messages(4), 2)
    delete_below(feed.settings, stream.examples_topic, 0, 4)  # offset 3 removed
    with pytest.raises(OffsetGapError, match=r"1 of partition 0 \(offsets 3-3\)"):
        run_student(config, feed.settings)
    onward = dataclasses.replace(config, on_offset_gap="continue")
    resumed = run_student(onward, feed.settings)
    assert resumed["messages"] == 6 + len(sent) - 1  # the removed one, not trained
    state = load_latest(config.checkpoint_dir)
    assert state is not None
    assert [(g["partition"], g["from"], g["to"]) for g in state[0]["offset_gaps"]] == [
        (0, 3, 4)
    ]
    assert state[0]["offsets"] == {"0": 5, "1": 5}


def test_a_gap_continued_past_is_a_prometheus_counter(feed: ExampleFeed) -> None:
    from tests.test_metrics import free_port, scrape, value
    from trainer.data.kafka_source import KafkaSource
    from trainer.metrics.reporting import Reporter

    topic, _ = feed.topic(feed.messages(6), 1)
    delete_below(feed.settings, topic, 0, 4)
    earlier = {"topic": topic, "partition": 0, "from": 0, "to": 1, "records": 1}
    source = KafkaSource(
        feed.settings, topic, "g-metric", max_seq_len=4096, offsets={0: 2},
        gaps=[earlier], on_gap="continue",
    ).start()  # fmt: skip
    reporter = Reporter(prometheus_port=free_port())
    try:
        reporter.watch_gaps(topic, source.gap_records)
        samples = scrape(reporter.prometheus_port)
    finally:
        reporter.close()
        source.close()
    # The checkpoint's gap and this start's (offsets 2-3), run-wide.
    assert value(samples, "gem_trainer_offset_gap_records_total", topic=topic) == 3
    assert source.offsets() == {0: 4}
