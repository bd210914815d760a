"""The trainer's commands as a user meets them: defaults from the run's
dataclass, the light name lists agreeing with the registries, one-line
errors for bad input, and ``trainer.fit --save`` feeding distillation with
no preset flag (the checkpoint carries the model's configuration)."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from benchmarks.generated import generated_features
from features.config_flags import config_fields
from pipelines.sources.synthetic import GeneratorConfig
from tests.interpreter import run_python
from trainer import daemon as daemon_command
from trainer import fit as fit_command
from trainer.data import split
from trainer.distill import command as distill_command
from trainer.distill import daemon as student_daemon_command
from trainer.distill import teacher_outputs as teacher_outputs_command
from trainer.distill import teacher_pass as teacher_outputs
from trainer.distill import teacher_stream as teacher_stream_command
from trainer.distill.records import read_teacher_outputs
from trainer.distill.run_config import (
    FULL,
    STUDENT_NAMES,
    DistillConfig,
    StudentDaemonConfig,
)
from trainer.distill.student import STUDENT_PRESETS
from trainer.distill.teacher import load_teacher
from trainer.distill.teacher_outputs import TeacherOutputsConfig
from trainer.distill.teacher_stream import TeacherStreamConfig
from trainer.distill.teacher_topic import run_stream
from trainer.distributed.model_parallel import DEFAULT_MIN_ROWS
from trainer.distributed.strategy import SHARDINGS as SHARDING_MODES
from trainer.distributed.tables import EMBEDDING_OPTIMIZERS as SHARDING_OPTIMIZERS
from trainer.models.base_rate import BaseRateOffset, prior_logits
from trainer.models.config import PRESETS, config_from_dict, tiny
from trainer.models.loss_wrapper import GEMTrain
from trainer.models.registry import MODEL_NAMES, build_model
from trainer.training.checkpoint import (
    list_checkpoints,
    read_checkpoint_file,
    save_checkpoint,
)
from trainer.training.run_config import (
    EMBEDDING_OPTIMIZERS,
    MIN_SHARDED_ROWS,
    PRESET_NAMES,
    SHARDINGS,
    DaemonConfig,
    FitConfig,
)
from trainer.training.run_config import MODEL_NAMES as LIGHT_MODEL_NAMES

REPO = Path(__file__).resolve().parents[1]
FAST = ["--preset", "tiny", "--max-seq-len", "32", "--batch-size", "256"]


def test_the_light_name_lists_agree_with_the_registries() -> None:
    assert LIGHT_MODEL_NAMES == MODEL_NAMES
    assert PRESET_NAMES == tuple(PRESETS)
    assert (SHARDINGS, EMBEDDING_OPTIMIZERS) == (SHARDING_MODES, SHARDING_OPTIMIZERS)
    assert MIN_SHARDED_ROWS == DEFAULT_MIN_ROWS
    assert STUDENT_NAMES == tuple(STUDENT_PRESETS)


def test_flag_defaults_are_the_dataclasses() -> None:
    fit_args = fit_command.build_parser().parse_args(
        ["--train", "a", "--eval", "b", "--metrics-out", "m.json"]
    )
    fields = {f.name for f in dataclasses.fields(FitConfig)}
    flagged = {k: v for k, v in vars(fit_args).items() if k in fields}
    assert FitConfig(**flagged) == FitConfig(train=Path("a"), eval=Path("b"))
    daemon_args = daemon_command.build_parser().parse_args(
        ["--topic", "t", "--checkpoint-dir", "c"]
    )
    fields = {f.name for f in dataclasses.fields(DaemonConfig)}
    flagged = {k: v for k, v in vars(daemon_args).items() if k in fields}
    assert DaemonConfig(**flagged) == DaemonConfig(topic="t", checkpoint_dir=Path("c"))
    # Both commands train a real model unless told otherwise.
    assert daemon_args.preset == fit_args.preset == "default"
    distill_args = distill_command.build_parser().parse_args(
        ["--examples", "e", "--teacher", "t", "--metrics-out", "m"]
    )
    assert DistillConfig(**config_fields(distill_args, DistillConfig)) == (
        DistillConfig()
    )
    assert distill_args.methods == DistillConfig().methods == FULL
    required = ["--examples", "e", "--teacher", "t", "--metrics-out", "m"]
    switched = distill_command.build_parser().parse_args(
        [*required, "--no-adapter-tracker", "--share-frozen", "--methods", "repr,aux"]
    )
    parsed = DistillConfig(**config_fields(switched, DistillConfig))
    assert (parsed.adapter_tracker, parsed.share_frozen) == (False, True)
    assert parsed.methods == ("aux", "repr")
    topics = ["--examples-topic", "e", "--teacher-topic", "t", "--group", "g"]
    student_args = student_daemon_command.build_parser().parse_args(
        [*topics, "--domain", "facebook", "--teacher", "p", "--checkpoint-dir", "c"]
    )
    assert StudentDaemonConfig(
        **config_fields(student_args, StudentDaemonConfig),
        distill=DistillConfig(**config_fields(student_args, DistillConfig)),
    ) == StudentDaemonConfig(
        examples_topic="e",
        teacher_topic="t",
        group="g",
        domain="facebook",
        teacher=Path("p"),
        checkpoint_dir=Path("c"),
    )
    outputs_args = teacher_outputs_command.build_parser().parse_args(
        ["--examples", "e", "--teacher", "t", "--output", "o"]
    )
    assert outputs_args.batch_size == teacher_outputs.DEFAULT_BATCH_SIZE
    outputs = TeacherOutputsConfig(**config_fields(outputs_args, TeacherOutputsConfig))
    assert outputs == TeacherOutputsConfig(
        examples=Path("e"), teacher=Path("t"), output=Path("o")
    )


def test_the_teacher_stream_flags_are_run_stream_s_keywords() -> None:
    required = ["--examples-topic", "e", "--output-topic", "o", "--teacher", "t"]
    args = teacher_stream_command.build_parser().parse_args(
        [*required, "--checkpoint-dir", "c"]
    )
    config = TeacherStreamConfig(**config_fields(args, TeacherStreamConfig))
    assert config == TeacherStreamConfig(
        examples_topic="e",
        output_topic="o",
        teacher_path=Path("t"),
        checkpoint_dir=Path("c"),
    )
    keywords = inspect.signature(run_stream).parameters.keys() - {"settings"}
    assert {f.name for f in dataclasses.fields(config)} - {"threads"} == keywords


def _one_line_error(capsys: pytest.CaptureFixture[str], prog: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"python -m {prog}: error: ")
    return err[0]


def test_daemon_without_a_cluster_says_so_before_loading_torch() -> None:
    script = (
        "import sys\n"
        "from trainer.daemon import main\n"
        "code = main(['--topic', 't', '--checkpoint-dir', 'c'])\n"
        "print(code, 'torch' in sys.modules)\n"
    )
    done = run_python(script)
    assert done.stdout.split() == ["2", "False"], done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("python -m trainer.daemon: error: no Kafka cluster named")
    assert "--kafka-bootstrap" in line
    help_text = daemon_command.build_parser().format_help()
    assert "required" in help_text
    assert "embedded broker is started" not in help_text


@pytest.fixture(scope="module")
def periods(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """train / validation / eval folders cut by ``python -m trainer.data.split``."""
    root = tmp_path_factory.mktemp("trainer-cli")
    generated_features(
        GeneratorConfig(users=300, ads=60, days=3, seed=7), root / "gen", root / "f"
    )
    dirs = {name: root / name for name in ("train", "validation", "eval")}
    argv = ["--input", str(root / "f")]
    for name, path in dirs.items():
        argv += [f"--{name}", str(path)]
    assert split.main(argv) == 0
    return dirs


def test_fit_save_then_distill_with_no_preset_flag(
    periods: dict[str, Path], tmp_path: Path
) -> None:
    ckpt, metrics = tmp_path / "teacher", tmp_path / "fit.json"
    argv = [f"--{name}={path}" for name, path in periods.items()]
    argv += ["--epochs", "2", "--max-steps-per-epoch", "2", *FAST]
    argv += ["--metrics-out", str(metrics), "--save", str(ckpt)]
    assert fit_command.main(argv) == 0
    report = json.loads(metrics.read_text())
    (path,) = list_checkpoints(ckpt)
    assert report["checkpoint"] == str(path)
    state = read_checkpoint_file(path)  # verified: manifest and checksums
    assert (state["model_name"], state["model_preset"]) == ("gem", "tiny")
    config = config_from_dict(state["model_config"])
    assert config.embedding.max_seq_len == 32  # --max-seq-len is in it
    assert config == dataclasses.replace(
        tiny(), embedding=dataclasses.replace(tiny().embedding, max_seq_len=32)
    )
    assert load_teacher(ckpt).config == config

    out = tmp_path / "distill.json"
    distill = [
        "--examples", str(periods["validation"]), "--eval", str(periods["eval"]),
        "--teacher", str(ckpt), "--domains", "facebook", "--batch-size", "128",
        "--metrics-out", str(out),
    ]  # fmt: skip
    assert distill_command.main(distill) == 0
    distilled = json.loads(out.read_text())
    assert distilled["teacher_checkpoint"] == str(path)
    assert distilled["teacher_step"] == state["step"]
    # The teacher distillation ran is the model trainer.training.fit evaluated.
    teacher = distilled["domains"]["facebook"]["eval"]["teacher"]
    for objective, metric in teacher.items():
        fitted = report["by_task"][f"facebook/{objective}"]
        assert metric["count"] == fitted["count"]
        assert metric["ne"] == pytest.approx(fitted["ne"], rel=1e-4)


def test_distill_teacher_sees_the_history_length_it_is_given(
    periods: dict[str, Path], tmp_path: Path
) -> None:
    ckpt = tmp_path / "teacher"
    argv = [f"--{name}={path}" for name, path in periods.items()]
    argv += ["--epochs", "1", "--max-steps-per-epoch", "2", *FAST]
    argv += ["--metrics-out", str(tmp_path / "fit.json"), "--save", str(ckpt)]
    assert fit_command.main(argv) == 0
    examples = str(periods["validation"])
    distilled = tmp_path / "distilled"
    distill = [
        "--examples", examples, "--eval", str(periods["eval"]), "--teacher", str(ckpt),
        "--teacher-outputs", str(distilled), "--teacher-max-seq-len", "2",
        "--eval-teacher-outputs", str(tmp_path / "eval_outputs"),
        "--domains", "facebook", "--metrics-out", str(tmp_path / "distill.json"),
    ]  # fmt: skip
    assert distill_command.main(distill) == 0
    outputs = {}
    for length in ("2", "32"):
        folder = tmp_path / f"direct-{length}"
        direct = ["--examples", examples, "--teacher", str(ckpt)]
        direct += ["--output", str(folder), "--max-seq-len", length]
        assert teacher_outputs_command.main(direct) == 0
        outputs[length] = read_teacher_outputs(folder)
    got = read_teacher_outputs(distilled)
    assert got.equals(outputs["2"])
    assert not got.equals(outputs["32"])  # the length matters on this data


def test_fit_bad_input_is_one_line(
    periods: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--eval", str(periods["eval"]), "--metrics-out", str(tmp_path / "m")]
    assert fit_command.main(["--train", str(tmp_path / "nope"), *base]) == 2
    assert "--train" in _one_line_error(capsys, "trainer.fit")
    argv = ["--train", str(periods["train"]), *base, "--patience", "1"]
    assert fit_command.main([*argv, "--holdout", "0"]) == 2
    assert "needs a validation period" in _one_line_error(capsys, "trainer.fit")
    broken = tmp_path / "broken"
    for part in ("examples/date=2026-10-01", "timelines"):
        (broken / part).mkdir(parents=True)
        (broken / part / "part-0.parquet").write_bytes(b"not parquet at all")
    assert fit_command.main(["--train", str(broken), *base, *FAST]) == 2
    line = _one_line_error(capsys, "trainer.fit")
    assert f"--train {broken}: unreadable" in line


def test_a_checkpoint_without_its_model_config_says_what_to_do(
    periods: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = GEMTrain(BaseRateOffset(build_model("gem", "tiny"), prior_logits()))
    bare = save_checkpoint(
        tmp_path / "bare",
        {"model": model.state_dict(), "optimizer": {}, "step": 1, "offsets": {}},
    )
    argv = ["--examples", str(periods["eval"]), "--output", str(tmp_path / "o")]
    assert teacher_outputs_command.main([*argv, "--teacher", str(bare)]) == 2
    line = _one_line_error(capsys, "trainer.distill.teacher_outputs")
    assert "does not say which model it holds" in line
    assert "python -m trainer.fit --save" in line
    # A corrupt file and an empty folder: one line each, naming the flag.
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(bare.read_bytes()[:1000])
    assert teacher_outputs_command.main([*argv, "--teacher", str(corrupt)]) == 2
    assert f"--teacher {corrupt}: unreadable" in _one_line_error(
        capsys, "trainer.distill.teacher_outputs"
    )
    (tmp_path / "empty").mkdir()
    argv += ["--teacher", str(tmp_path / "empty")]
    assert teacher_outputs_command.main(argv) == 2
    assert "no checkpoint files" in _one_line_error(
        capsys, "trainer.distill.teacher_outputs"
    )
