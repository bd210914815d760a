"""The Kafka trainer daemon: checkpoints, progressive metrics, poison, resume.

Fault tests (SIGKILL, SIGTERM, broker pause, two ranks) are in
``test_daemon_faults.py``; the example messages they train on come from
:mod:`tests.example_feed`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from features.metrics import binary_metrics
from features.windows import timeline_segments
from pipelines.core.reference import ReferenceOutput
from tests.example_feed import MAX_LEN, ExampleFeed, out_of_range_message
from trainer.metrics.progressive import ProgressiveMetrics
from trainer.models.config import tiny
from trainer.training.checkpoint import (
    list_checkpoints,
    load_latest,
    model_from_record,
    save_checkpoint,
)
from trainer.training.daemon import DaemonConfig, run, run_daemon_until_drained
from trainer.training.step import EvalOutput


def applied_chain(log_path: Path, checkpoint_dir: Path) -> list[tuple[int, int]]:
    """Records in the final checkpoint's state, from its lineage chain."""
    entries = {}
    for line in log_path.read_text().splitlines():
        entry = json.loads(line)
        entries[entry["id"]] = entry
    loaded = load_latest(checkpoint_dir)
    assert loaded is not None
    node: str | None = loaded[0]["lineage"]
    records: list[tuple[int, int]] = []
    while node:
        records += [tuple(r) for r in entries[node]["records"]]
        node = entries[node]["parent"]
    return records


def test_checkpoint_keep_and_corrupt_fallback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for step in (1, 2, 3, 4):
        state = {"model": {"w": torch.full((3,), float(step))}, "optimizer": {}}
        save_checkpoint(
            tmp_path, {**state, "step": step, "offsets": {"0": step}}, keep=3
        )
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt-0000000002.pt",
        "ckpt-0000000003.pt",
        "ckpt-0000000004.pt",
    ]
    newest = list_checkpoints(tmp_path)[-1]
    newest.write_bytes(newest.read_bytes()[:100])  # a torn write
    with caplog.at_level(logging.WARNING):
        loaded = load_latest(tmp_path)
    assert loaded is not None
    assert loaded[0]["step"] == 3
    assert "unreadable" in caplog.text
    assert newest.name in caplog.text


def test_progressive_histogram_auc_matches_exact() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    p = rng.uniform(0.001, 0.4, (n, 2))
    y = (rng.uniform(size=(n, 2)) < p).astype(np.float64)
    d = rng.integers(0, 3, n)
    metrics = ProgressiveMetrics(window_examples=500)
    for i in range(0, n, 400):
        rows = slice(i, i + 400)
        metrics.update(
            EvalOutput(
                torch.tensor(p[rows]), torch.tensor(y[rows]), torch.tensor(d[rows])
            )
        )
    exact = binary_metrics(y[d == 1, 0], p[d == 1, 0])
    got = metrics.table()["instagram/click"]
    assert got["count"] == exact.count
    assert got["ne"] == pytest.approx(exact.ne, rel=1e-9)
    assert got["calibration"] == pytest.approx(exact.calibration, rel=1e-9)
    assert got["auc"] == pytest.approx(exact.auc, abs=2e-3)
    assert metrics.table("last_window")["instagram/click"]["count"] >= 500
    restored = ProgressiveMetrics()
    restored.load_state_dict(metrics.state_dict())
    assert restored.table() == metrics.table()


def test_poison_set_aside_and_drained_run(feed: ExampleFeed, tmp_path: Path) -> None:
    topic = feed.new_topic(1)
    good = feed.messages(8)
    values = [*good[:3], b"garbage", out_of_range_message(feed.reference), *good[3:]]
    feed.publish(topic, values, 1)
    result = run_daemon_until_drained(
        feed.settings,
        topic,
        "g-poison",
        tmp_path / "ckpt",
        idle_seconds=2.0,
        preset="tiny",
        metrics_jsonl=tmp_path / "m.jsonl",
        log_every=2,
    )
    assert result["step"] == 8
    assert result["dead_letters"] == 2
    assert result["offsets"] == {0: 10}
    assert set(result["metrics"])
    assert Path(result["png"]).stat().st_size > 0
    assert all(0 < v["count"] for v in result["metrics"].values())
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) >= 4

    consumer = feed.settings.consumer(
        f"{topic}.dead-letter", auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    letters = list(consumer)
    consumer.close()
    reasons = {dict(m.headers)["dead-letter-offset"]: dict(m.headers) for m in letters}
    assert set(reasons) == {b"3", b"4"}
    assert (
        b"magic" in reasons[b"3"]["dead-letter-reason"]
        or b"short" in reasons[b"3"]["dead-letter-reason"]
    )
    assert b"user_gender" in reasons[b"4"]["dead-letter-reason"]


def test_resume_equals_uninterrupted(feed: ExampleFeed, tmp_path: Path) -> None:
    topic, _ = feed.topic(feed.messages(12), 1)

    def config(name: str, **kw: object) -> DaemonConfig:
        return DaemonConfig(
            topic=topic,
            group=f"g-{name}",
            checkpoint_dir=tmp_path / name,
            preset="tiny",
            idle_seconds=2.0,
            checkpoint_every=100,
            **kw,  # type: ignore[arg-type]
        )

    whole = run(config("whole"), feed.settings)
    first = run(config("split", max_steps=5), feed.settings)
    rest = run(config("split"), feed.settings)
    assert (whole["step"], first["step"], rest["step"]) == (12, 5, 12)
    a = load_latest(tmp_path / "whole")
    b = load_latest(tmp_path / "split")
    assert a is not None
    assert b is not None
    # Every checkpoint says which model it holds (what distillation reads).
    assert model_from_record(a[0], a[1]) == ("gem", tiny())
    assert a[0]["model_preset"] == "tiny"
    for name, tensor in a[0]["model"].items():
        torch.testing.assert_close(b[0]["model"][name], tensor, rtol=1e-6, atol=1e-7)
    assert rest["metrics"].keys() == whole["metrics"].keys()
    for key, values in whole["metrics"].items():
        assert rest["metrics"][key]["ne"] == pytest.approx(
            values["ne"], rel=1e-5, nan_ok=True
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_batches_copy_to_the_gpu_unchanged(reference: ReferenceOutput) -> None:
    """The daemon's GPU input path: pin on the decode thread, copy non-blocking."""
    from trainer.data.inputs import make_batch

    chunk = reference.examples.slice(0, 16)
    batch = make_batch(
        chunk,
        timeline_segments(chunk, reference.timelines, MAX_LEN),
        max_seq_len=MAX_LEN,
    )
    pinned = batch.pin_memory()
    assert pinned.dense.is_pinned()
    moved = pinned.to(torch.device("cuda"), non_blocking=True)
    torch.cuda.synchronize()
    torch.testing.assert_close(moved.dense.cpu(), batch.dense)
    torch.testing.assert_close(moved.sequence.values().cpu(), batch.sequence.values())
    torch.testing.assert_close(moved.labels.cpu(), batch.labels)
