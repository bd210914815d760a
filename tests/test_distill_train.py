"""Teacher outputs, student training and the ``python -m trainer.distill`` CLI
on a tiny generated world (real GEM teacher, real torchrec students)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from benchmarks.generated import generated_features
from features.serving_artifacts import current_version, load_manifest
from features.vocab import DOMAINS, TRAINING_OBJECTIVES
from pipelines.sources.synthetic import GeneratorConfig
from tests.interpreter import run_python
from trainer.data.feature_output import (
    ExampleDataset,
    event_time_ms,
    read_examples,
    read_timelines,
    time_forward_split,
)
from trainer.distill import teacher_pass as teacher_outputs
from trainer.distill.adapter import StudentAdapter
from trainer.distill.records import read_teacher_outputs
from trainer.distill.run_config import DistillConfig
from trainer.distill.student_data import StudentData
from trainer.distill.student_trainer import (
    adapter_step,
    build_student,
    train_student,
)
from trainer.distill.teacher import load_teacher, train_teacher
from trainer.models.config import tiny

REPO = Path(__file__).resolve().parents[1]
SEQ = 16


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 3-day world; a teacher trained on day 1 only (stale for days 2-3);
    its outputs for every example of days 2-3."""
    root = tmp_path_factory.mktemp("distill")
    config = GeneratorConfig(users=250, ads=50, days=3, seed=11)
    generated_features(config, root / "gen", root / "f")
    cut = int(event_time_ms(read_examples(root / "f")).min()) // 86_400_000 + 1
    time_forward_split(root / "f", cut * 86_400_000, root / "old", root / "new")
    cfg = tiny()
    cfg = dataclasses.replace(
        cfg, embedding=dataclasses.replace(cfg.embedding, max_seq_len=SEQ)
    )
    ckpt = train_teacher(
        ExampleDataset(root / "old", max_seq_len=SEQ),
        cfg,
        root / "teacher",
        batch_size=512,
    )
    summary = teacher_outputs.run(root / "new", ckpt, root / "new" / "teacher_outputs")
    assert summary["teacher_outputs"] == summary["examples"]
    return {"root": root, "new": root / "new", "ckpt": ckpt}


def test_teacher_outputs_one_row_per_example(world: dict[str, Path]) -> None:
    outputs = read_teacher_outputs(world["new"] / "teacher_outputs")
    examples = read_examples(world["new"])
    ids = outputs.column("example_id")
    assert len(outputs) == len(examples)
    assert pc.count_distinct(ids).as_py() == len(outputs)
    assert set(ids.to_pylist()) == set(examples.column("example_id").to_pylist())
    teacher = load_teacher(world["ckpt"])
    assert set(outputs.column("teacher_step").to_pylist()) == {teacher.step}
    times = outputs.column("teacher_time").cast(pa.int64()).to_numpy()
    assert set(times.tolist()) == {teacher.time_ms}
    # The teacher is older than every example it scored.
    assert teacher.time_ms < event_time_ms(examples).min()
    logits = np.stack(outputs.column("teacher_logits").to_numpy(zero_copy_only=False))
    assert logits.shape == (len(outputs), len(DOMAINS) * len(TRAINING_OBJECTIVES))
    assert np.isfinite(logits).all()
    assert logits.std() > 0


def _data(world: dict[str, Path], domain: str, keep_every: int = 1) -> StudentData:
    outputs = read_teacher_outputs(world["new"] / "teacher_outputs")
    if keep_every > 1:  # drop some teacher rows: those examples are "absent"
        outputs = outputs.take(pa.array(np.arange(0, len(outputs), keep_every)))
    return StudentData(
        read_examples(world["new"]), read_timelines(world["new"]), domain, outputs
    )


def test_adapter_step_touches_only_its_parameters(world: dict[str, Path]) -> None:
    data = _data(world, "facebook")
    cfg = DistillConfig(methods=("aux", "adapter", "repr"))
    student = build_student(
        cfg,
        dim=8,
        cap=1000,
        teacher_embedding_dim=data.teacher_embedding_dim,
        base_logits=data.base_logits(),
    )
    adapter = StudentAdapter()
    before_student = {k: v.clone() for k, v in student.state_dict().items()}
    before_adapter = {k: v.clone() for k, v in adapter.state_dict().items()}
    optimizer = torch.optim.Adam(adapter.parameters(), lr=1e-2)
    sb = next(data.batches(128))
    for _ in range(2):  # the zero-initialised last layer moves the rest on step 2
        adapter_step(adapter, optimizer, sb, data.domain_index)
    for name, value in student.state_dict().items():
        assert torch.equal(value, before_student[name]), name
    assert all(p.grad is None for p in student.parameters())
    changed = [
        k
        for k, v in adapter.state_dict().items()
        if not torch.equal(v, before_adapter[k])
    ]
    assert len(changed) == len(before_adapter)


def test_student_reports_the_staleness_it_saw(world: dict[str, Path]) -> None:
    data = _data(world, "facebook", keep_every=3)
    teacher = load_teacher(world["ckpt"])
    cfg = DistillConfig(methods=("standard", "adapter"), batch_size=128)
    _, _, report = train_student(cfg, data, dim=8, cap=1000)
    seen = report["teacher_seen"]
    assert seen["teacher_steps"] == [teacher.step]
    has = data.teacher.present
    assert seen["examples_with_teacher"] == int(has.sum())
    assert has.any()
    assert seen["examples_without_teacher"] == int((~has).sum()) > 0
    hours = (data.times[has] - teacher.time_ms) / 3_600_000
    stale = seen["staleness_hours"]
    assert stale["min"] > 0  # an older checkpoint: every example is newer
    assert stale["min"] == pytest.approx(hours.min(), rel=1e-5)
    assert stale["max"] == pytest.approx(hours.max(), rel=1e-5)
    assert stale["mean"] == pytest.approx(hours.mean(), rel=1e-4)


CHILD = """
import json, sys
from trainer.distill.__main__ import main
rc = main(sys.argv[1:])
teacher_code = ("trainer.distill.teacher", "trainer.distill.teacher_pass",
                "trainer.models.gem", "trainer.models.registry",
                "trainer.modules.heads", "trainer.modules.interformer")
print(json.dumps({"rc": rc, "imported": [m for m in teacher_code if m in sys.modules]}))
"""


def test_cli_trains_each_domain_without_the_teacher_code(
    world: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "metrics.json"
    argv = ["--examples", str(world["new"]), "--teacher", str(world["ckpt"])]
    argv += ["--methods", "full", "--batch-size", "128", "--metrics-out", str(out)]
    argv += ["--domains", "facebook"]  # one student keeps the test short
    run = run_python(CHILD, *argv, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    child = json.loads(run.stdout.strip().splitlines()[-1])
    assert child == {"rc": 0, "imported": []}
    report = json.loads(out.read_text())
    # Served beside the report: the student, and the teacher whose embedding
    # it reads, exported by python -m trainer.export in a subprocess.
    student = load_manifest(Path(report["domains"]["facebook"]["artifact"]))
    assert student.kind == "student"
    assert student.domain == "facebook"
    assert student.max_seq_len == SEQ
    assert student.teacher_embedding_dim > 0
    serving = tmp_path / "serving"
    gem = load_manifest(
        serving / "gem" / "versions" / student.source["teacher_version"]
    )
    assert gem.source["checkpoint"] == str(world["ckpt"])
    assert gem.max_seq_len == SEQ
    assert (
        current_version(serving / "student-facebook")
        == Path(report["domains"]["facebook"]["artifact"]).name
    )
    assert report["teacher_seen"]["max_staleness_hours"] > 0
    trained = [d for d, r in report["domains"].items() if "eval" in r]
    assert trained == ["facebook"], report["domains"]
    for d in trained:
        r = report["domains"][d]
        assert r["methods"] == ["aux", "adapter", "repr", "share"]
        assert r["student"]["teacher_embedding_dim"] > 0
        assert "t_user_id" in r["shared_tables"]
        assert set(r["eval"]["student"]) == set(TRAINING_OBJECTIVES)
        assert set(r["eval"]["teacher"]) == set(TRAINING_OBJECTIVES)
        assert r["eval"]["student"]["click"]["count"] > 0
