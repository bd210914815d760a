"""What an operator alerts on: ``/metrics`` scraped over HTTP, TensorBoard read back.

The reporter is driven by real progressive metrics, the lag comes from a
real consumer on the embedded broker, and the end-to-end test scrapes a
running ``python -m trainer.daemon`` across a checkpoint and a restart.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from features.vocab import DOMAINS
from tests.example_feed import ExampleFeed, message_chunks
from tests.test_daemon_faults import finish, start, wait_for
from trainer.data.kafka_source import KafkaSource
from trainer.metrics.progressive import ProgressiveMetrics
from trainer.metrics.prometheus import RunTotals
from trainer.metrics.reporting import Reporter, ThinnedHistory
from trainer.training.step import EvalOutput

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(port: int) -> Samples:
    """``/metrics`` over HTTP, parsed: (sample name, sorted labels) → value."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape_when_up(port: int) -> Samples | None:
    """A scrape, or None while the endpoint is not listening yet."""
    try:
        return scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return None


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``directory``: tag → (step, value)."""
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    accumulator = EventAccumulator(str(directory))
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def scored_batch(rng: np.random.Generator, n: int = 400) -> EvalOutput:
    p = rng.uniform(0.01, 0.3, (n, 2))
    y = (rng.uniform(size=(n, 2)) < p).astype(np.float64)
    d = rng.integers(0, 3, n)
    return EvalOutput(torch.tensor(p), torch.tensor(y), torch.tensor(d))


def test_history_keeps_a_bounded_evenly_spaced_span_of_the_run() -> None:
    history = ThinnedHistory(cap=8)
    for step in range(100):
        history.append({"step": step})
        assert len(history) <= 9  # the cap, plus the latest record
    steps = [r["step"] for r in history.records]
    assert steps[0] == 0
    assert steps[-1] == 99
    gaps = {b - a for a, b in itertools.pairwise(steps[:-1])}
    assert gaps == {history.stride}
    with pytest.raises(ValueError, match="at least 2"):
        ThinnedHistory(cap=1)


def test_reporter_history_stays_bounded_and_still_plots(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    metrics = ProgressiveMetrics(window_examples=200)
    reporter = Reporter(history_cap=16)
    try:
        for step in range(1, 101):
            metrics.update(scored_batch(rng, 50))
            reporter.log(
                step=step,
                examples=50 * step,
                loss=0.1,
                dead_letters=0,
                metrics=metrics,
            )
        kept = [r["step"] for r in reporter.history]
        assert len(kept) <= 17
        assert (kept[0], kept[-1]) == (1, 100)
        png = reporter.plot(tmp_path / "ne.png")
        assert png is not None
        assert png.stat().st_size > 0
    finally:
        reporter.close()


def test_reporter_serves_counters_quality_and_checkpoint_age(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    metrics = ProgressiveMetrics(window_examples=500)
    checkpoint = tmp_path / "ckpt-0000000010.pt"
    checkpoint.write_bytes(b"x")
    an_hour_ago = time.time() - 3600
    os.utime(checkpoint, (an_hour_ago, an_hour_ago))
    reporter = Reporter(
        prometheus_port=free_port(),
        tensorboard_dir=tmp_path / "tb",
        restored=RunTotals(
            step=10, examples=4000, dead_letters=2, checkpoint=checkpoint
        ),
    )
    try:
        before = scrape(reporter.prometheus_port)
        assert value(before, "gem_trainer_steps_total") == 10
        assert value(before, "gem_trainer_examples_total") == 4000
        assert value(before, "gem_trainer_dead_letters_total") == 2
        assert value(before, "gem_trainer_last_checkpoint_step") == 10
        assert value(before, "gem_trainer_last_checkpoint_age_seconds") >= 3600

        for step in (11, 12):
            metrics.update(scored_batch(rng))
            reporter.log(
                step=step,
                examples=4000 + 400 * (step - 10),
                loss=0.25,
                dead_letters=3,
                metrics=metrics,
            )
        reporter.checkpoint_written(12)
        reporter.checkpoint_failed()
        after = scrape(reporter.prometheus_port)
        assert value(after, "gem_trainer_steps_total") == 12
        assert value(after, "gem_trainer_examples_total") == 4800
        assert value(after, "gem_trainer_dead_letters_total") == 3
        assert value(after, "gem_trainer_checkpoint_write_failures_total") == 1
        assert value(after, "gem_trainer_last_checkpoint_step") == 12
        assert value(after, "gem_trainer_last_checkpoint_age_seconds") < 3600
        assert value(after, "gem_trainer_loss") == 0.25
        assert value(after, "gem_trainer_examples_per_second") > 0
        table = metrics.table("lifetime")
        assert table
        for key, expected in table.items():
            domain, objective = key.split("/")
            labels = {"domain": domain, "objective": objective, "scope": "lifetime"}
            for name in ("ne", "auc", "calibration"):
                got = value(after, f"gem_trainer_{name}", **labels)
                assert got == pytest.approx(expected[name], nan_ok=True)
    finally:
        reporter.close()

    scalars = tensorboard_scalars(tmp_path / "tb")
    assert [step for step, _ in scalars["train/loss"]] == [11, 12]
    assert {v for _, v in scalars["train/loss"]} == {0.25}
    key = next(iter(table))
    ne = scalars[f"lifetime/ne/{key}"]
    assert [step for step, _ in ne] == [11, 12]
    assert ne[-1][1] == pytest.approx(table[key]["ne"], rel=1e-6)
    assert "train/examples_per_second" in scalars


def test_consumer_lag_per_partition_from_a_real_topic(feed: ExampleFeed) -> None:
    topic = feed.new_topic(2)
    feed.publish(topic, feed.messages(7), 2)  # 4 in p0, 3 in p1
    ends = {0: 4, 1: 3}
    source = KafkaSource(
        feed.settings, topic, "g-lag", max_seq_len=4096, queue_size=2
    ).start()
    marked: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 60
        # Fetched and queued is not trained: everything still counts as lag.
        while source.lag() != ends:
            assert time.monotonic() < deadline, f"lag {source.lag()} != {ends}"
            time.sleep(0.05)
        while set(marked) != {0, 1}:
            assert time.monotonic() < deadline, "no records from both partitions"
            item = source.next(timeout=1.0)
            if item is not None:
                source.mark(item.partition, item.offset + 1)
                source.iteration_done()
                marked[item.partition] = item.offset + 1
        expected = {p: ends[p] - marked[p] for p in ends}
        while source.lag() != expected:
            assert time.monotonic() < deadline, f"lag {source.lag()} != {expected}"
            time.sleep(0.05)
        assert sum(expected.values()) > 0
    finally:
        source.close()


def test_daemon_metrics_over_http_across_a_checkpoint_and_a_restart(
    feed: ExampleFeed, tmp_path: Path
) -> None:
    topic = feed.new_topic(2)
    good = feed.messages(7)
    feed.publish(topic, [*good[:4], b"garbage"], 2)
    port = free_port()
    args = [
        "--topic", topic, "--group", "g-metrics",
        "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--kafka-bootstrap", str(feed.settings.bootstrap),
        "--kafka-option", f"session.timeout.ms={feed.settings.session_timeout_ms}",
        "--kafka-option",
        f"heartbeat.interval.ms={feed.settings.heartbeat_interval_ms}",
        "--checkpoint-every", "6", "--log-every", "1",
        "--prometheus-port", str(port), "--tensorboard", str(tmp_path / "tb"),
    ]  # fmt: skip
    process = start(args, tmp_path)
    try:
        seen: dict[str, Samples] = {}

        def scraped(name: str, done: Callable[[Samples], bool]) -> bool:
            samples = scrape_when_up(port)
            if samples is not None and done(samples):
                seen[name] = samples
                return True
            return False

        def counted(samples: Samples, steps: int, dead: int) -> bool:
            return (
                value(samples, "gem_trainer_steps_total") == steps
                and value(samples, "gem_trainer_dead_letters_total") == dead
            )

        assert wait_for(
            lambda: scraped("first", lambda s: counted(s, 4, 1)), process, 120
        )
        first = seen["first"]
        assert value(first, "gem_trainer_examples_total") == 4 * 16
        lag = {
            labels: v
            for (name, labels), v in first.items()
            if name == "gem_trainer_consumer_lag_records"
        }
        assert lag == {
            (("partition", "0"), ("topic", topic)): 0.0,
            (("partition", "1"), ("topic", topic)): 0.0,
        }
        assert value(first, "gem_trainer_last_checkpoint_step") == -1
        assert any(
            name == "gem_trainer_ne" and dict(labels)["scope"] == "lifetime"
            for name, labels in first
        )

        time.sleep(1.0)  # the age before the checkpoint is now at least this
        produced = time.monotonic()
        feed.publish(topic, good[4:6], 2)  # steps 5, 6: a checkpoint
        assert wait_for(
            lambda: scraped("checkpointed", lambda s: counted(s, 6, 1)), process, 60
        )
        assert wait_for(
            lambda: scraped(
                "age", lambda s: value(s, "gem_trainer_last_checkpoint_step") == 6
            ),
            process,
            60,
        )
        age = value(seen["age"], "gem_trainer_last_checkpoint_age_seconds")
        assert age < time.monotonic() - produced  # restarted at the checkpoint

        process.send_signal(signal.SIGTERM)
        assert finish(process, 60) == 0
        process = start(args, tmp_path)
        # Nothing new to train on: 6 steps can only be the checkpoint's counts.
        assert wait_for(
            lambda: scraped("restarted", lambda s: counted(s, 6, 1)), process, 120
        )
        restarted = seen["restarted"]
        assert value(restarted, "gem_trainer_steps_total") == 6
        assert value(restarted, "gem_trainer_examples_total") == 6 * 16
        assert value(restarted, "gem_trainer_dead_letters_total") == 1
        assert value(restarted, "gem_trainer_last_checkpoint_step") == 6

        feed.publish(topic, good[6:], 2)
        assert wait_for(
            lambda: scraped("more", lambda s: counted(s, 7, 1)), process, 60
        )
        assert value(seen["more"], "gem_trainer_examples_total") == 7 * 16
        process.send_signal(signal.SIGTERM)
        assert finish(process, 60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    scalars = tensorboard_scalars(tmp_path / "tb")
    assert {step for step, _ in scalars["train/loss"]} == set(range(1, 8))
    quality = [tag for tag in scalars if tag.startswith("lifetime/ne/")]
    assert quality
    assert max(step for step, _ in scalars[quality[0]]) == 7


def test_student_daemon_metrics_over_http(feed: ExampleFeed, tmp_path: Path) -> None:
    from trainer.distill.student_daemon import run as run_student

    stream = feed.teacher_stream(tmp_path, 4)
    port = free_port()
    config = stream.student(
        tmp_path,
        idle_seconds=5.0,
        checkpoint_every=100,
        prometheus_port=port,
    )

    def run_and_scrape(done: Callable[[Samples], bool]) -> tuple[dict, Samples]:
        """Run the daemon in a thread; the first scrape ``done`` accepts."""
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["result"] = run_student(config, feed.settings)
            except BaseException as error:
                outcome["error"] = error

        thread = threading.Thread(target=target)
        thread.start()
        scraped: Samples | None = None
        deadline = time.monotonic() + 120
        while thread.is_alive() and time.monotonic() < deadline:
            samples = scrape_when_up(port)
            if samples is not None and done(samples):
                scraped = samples
                break
            time.sleep(0.02)
        thread.join(120)
        assert "error" not in outcome, outcome.get("error")
        assert scraped is not None, "no scrape matched while the daemon ran"
        return outcome["result"], scraped

    def lag_of(samples: Samples, topic: str) -> dict[str, float]:
        return {
            dict(labels)["partition"]: v
            for (name, labels), v in samples.items()
            if name == "gem_student_consumer_lag_records"
            and dict(labels)["topic"] == topic
        }

    facebook = DOMAINS.index("facebook") + 1
    expected = sum(
        chunk.column("domain").to_pylist().count(facebook)
        for chunk in message_chunks(feed.reference, 4)
    )
    assert expected > 0

    def caught_up(samples: Samples) -> bool:
        return (
            value(samples, "gem_student_examples_total") == expected
            and lag_of(samples, stream.examples_topic) == {"0": 0.0, "1": 0.0}
            and lag_of(samples, stream.teacher_topic) == {"0": 0.0, "1": 0.0}
        )

    first, during = run_and_scrape(caught_up)
    assert first["examples"] == expected
    assert value(during, "gem_student_steps_total") == first["step"]
    assert value(during, "gem_student_dead_letters_total") == 0
    assert value(during, "gem_student_last_checkpoint_step") == -1
    assert not any(name.startswith("gem_student_ne") for name, _ in during)

    # A restart with nothing new: the counters are the checkpoint's.
    again, restarted = run_and_scrape(lambda s: True)
    assert again["examples"] == first["examples"]
    assert value(restarted, "gem_student_examples_total") == first["examples"]
    assert value(restarted, "gem_student_steps_total") == first["step"]
    assert value(restarted, "gem_student_last_checkpoint_step") == first["step"]
