"""The daemon under faults, as a real process: SIGKILL/SIGTERM and restart,
a SIGKILLed and restarted broker, and two data-parallel ranks (torchrun, gloo)
in one group.

Exactly-once is proven from the checkpoints: with ``GEM_DAEMON_APPLIED_LOG``
each checkpoint appends the records applied since its parent; following the
final checkpoint's lineage back must give every record of the topic once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from features.kafka import KafkaSettings, ensure_topics
from launchers.kafka_broker import EmbeddedKafka
from pipelines.core.reference import ReferenceOutput
from tests.example_feed import ExampleFeed, messages, publish
from tests.test_daemon import applied_chain
from trainer.training.checkpoint import list_checkpoints, load_latest

REPO = Path(__file__).resolve().parents[1]


def daemon_command(
    settings: KafkaSettings, topic: str, group: str, directory: Path, *extra: str
) -> list[str]:
    """The CLI, with the settings' group timings."""
    return [
        "--topic", topic, "--group", group, "--checkpoint-dir", str(directory / "ckpt"),
        "--preset", "tiny", "--kafka-bootstrap", str(settings.bootstrap),
        "--kafka-option", f"session.timeout.ms={settings.session_timeout_ms}",
        "--kafka-option", f"heartbeat.interval.ms={settings.heartbeat_interval_ms}",
        *extra,
    ]  # fmt: skip


def start(args: list[str], directory: Path, **env: str) -> subprocess.Popen[bytes]:
    """``python -m trainer.daemon`` with the applied-offsets log on."""
    environment = {
        **os.environ,
        "GEM_DAEMON_APPLIED_LOG": str(directory / "applied.jsonl"),
        **env,
    }
    log = open(directory / "daemon.log", "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.daemon", *args],
        cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def wait_for(
    condition: Callable[[], bool], process: subprocess.Popen[bytes], timeout: float
) -> bool:
    """Poll ``condition`` until true (True) or the process exits (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.02)
    raise TimeoutError("daemon made no progress")


def finish(process: subprocess.Popen[bytes], timeout: float) -> int:
    """The daemon's exit code; one still running after ``timeout`` is killed."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def newest_step(directory: Path) -> int:
    """Step of the newest renamed checkpoint under ``directory/ckpt`` (-1: none)."""
    paths = list_checkpoints(directory / "ckpt")
    return int(paths[-1].name.removeprefix("ckpt-").split(".")[0]) if paths else -1


def log_lines(directory: Path) -> int:
    path = directory / "applied.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_sigkill_sigterm_restart_exactly_once(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    topic, sent = feed.topic(feed.messages(30), 2)
    args = daemon_command(
        feed.settings, topic, "g-crash", tmp_path,
        "--checkpoint-every", "2", "--idle-seconds", "2.5",
    )  # fmt: skip
    rng = random.Random(7)
    # 0-1, 3-4: SIGKILL at a random moment after a new checkpoint; 2: SIGKILL
    # inside the checkpoint write; 5: SIGTERM (must exit 0); then run to drain.
    for round_ in range(6):
        pause = {"GEM_CHECKPOINT_PAUSE_S": "2"} if round_ == 2 else {}
        process = start(args, tmp_path, **pause)
        before = newest_step(tmp_path)
        if round_ == 2:
            wait_for(lambda: any((tmp_path / "ckpt").glob(".ckpt-*.tmp")), process, 60)
            time.sleep(0.1)
        else:
            # A new renamed checkpoint (not just its applied-log entry, which
            # precedes the rename): so every restart has one to resume from,
            # however slow the write is on a loaded machine.
            assert wait_for(lambda b=before: newest_step(tmp_path) > b, process, 60)
            time.sleep(rng.uniform(0.0, 0.6))
        if round_ == 5:
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
        else:
            process.kill()
            process.wait(10)
    process = start(args, tmp_path)
    assert finish(process, 120) == 0
    records = applied_chain(tmp_path / "applied.jsonl", tmp_path / "ckpt")
    assert sorted(records) == sorted(sent)  # every record, exactly once
    state = load_latest(tmp_path / "ckpt")
    assert state is not None
    assert state[0]["step"] == len(sent)
    assert not list((tmp_path / "ckpt").glob(".*.tmp"))
    text = (tmp_path / "daemon.log").read_text()
    assert "finishing the step" in text
    assert text.count("resumed from") >= 5


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[EmbeddedKafka]:
    """A broker of our own, to SIGKILL without failing other tests."""
    if os.environ.get("GEM_KAFKA_BOOTSTRAP"):
        pytest.skip("needs the embedded broker's process")
    with EmbeddedKafka(home=tmp_path / "kafka") as broker:
        yield broker


def test_broker_sigkill_and_restart_is_survived(
    own_broker: EmbeddedKafka, reference: ReferenceOutput, tmp_path: Path
) -> None:
    """The broker dies mid-run and comes back on the same log directory: the
    daemon waits (the outage is not taken for a drained topic), resumes, and
    applies every acknowledged record exactly once."""
    settings = own_broker.settings
    topic = "crashing"
    ensure_topics(settings, {topic: 2})
    sent = publish(settings, topic, messages(reference, 30), 2)
    args = daemon_command(
        settings, topic, "g-broker-crash", tmp_path, "--checkpoint-every", "2",
        "--idle-seconds", "2",
    )  # fmt: skip
    process = start(args, tmp_path)
    assert wait_for(lambda: log_lines(tmp_path) > 0, process, 60)
    own_broker.kill()
    time.sleep(5)  # longer than --idle-seconds: must not count as drained
    assert process.poll() is None
    own_broker.start()  # same port, same data
    assert finish(process, 120) == 0
    assert sorted(
        applied_chain(tmp_path / "applied.jsonl", tmp_path / "ckpt")
    ) == sorted(sent)
    text = (tmp_path / "daemon.log").read_text()
    assert "unreachable" in text
    assert "reachable again" in text


def test_two_ranks_share_partitions(feed: ExampleFeed, tmp_path: Path) -> None:
    # Three partitions: uneven, one rank runs dry first (zero-weight steps).
    topic, sent = feed.topic(feed.messages(24), 3)
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [
        str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "trainer.daemon",
        *daemon_command(feed.settings, topic, "g-dp", tmp_path,
                        "--checkpoint-every", "4", "--idle-seconds", "3"),
    ]  # fmt: skip
    environment = {
        **os.environ,
        "GEM_DAEMON_APPLIED_LOG": str(tmp_path / "applied.jsonl"),
    }
    result = subprocess.run(
        command, cwd=REPO, env=environment, capture_output=True, timeout=150
    )
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert sorted(
        applied_chain(tmp_path / "applied.jsonl", tmp_path / "ckpt")
    ) == sorted(sent)
    for path in list_checkpoints(tmp_path / "ckpt"):
        state = load_latest(path.parent)
        assert state is not None
    final = load_latest(tmp_path / "ckpt")
    assert final is not None
    checksums = final[0]["param_checksums"]
    assert len(checksums) == 2
    assert checksums[0] == checksums[1]
    assert len(final[0]["metrics"]) == 2
    assert final[0]["world_size"] == 2
    assert len(sent) / 2 <= final[0]["step"] <= len(sent)
