"""``python -m trainer.data.split``: a feature-job output cut at UTC days into the
train / validation / eval folders ``trainer.training.fit`` reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.generated import generated_features
from pipelines.sources.synthetic import GeneratorConfig
from tests.interpreter import run_python
from trainer.data import split
from trainer.data.feature_output import (
    ExampleDataset,
    event_time_ms,
    read_examples,
    read_timelines,
)

DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reference-job output of 4 generated days."""
    root = tmp_path_factory.mktemp("split")
    generated_features(
        GeneratorConfig(users=200, ads=40, days=4, seed=3), root / "gen", root / "f"
    )
    return root / "f"


def _split(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = split.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _three_periods(
    capsys: pytest.CaptureFixture[str], features: Path, root: Path, *periods: str
) -> tuple[dict[str, Path], tuple[int, str, str]]:
    """The split into ``root``'s train / val / eval folders with ``periods``'
    flags: the folders, and the command's exit code and output."""
    dirs = {name: root / name for name in ("train", "val", "eval")}
    result = _split(
        capsys, "--input", str(features), "--train", str(dirs["train"]),
        "--validation", str(dirs["val"]), "--eval", str(dirs["eval"]), *periods,
    )  # fmt: skip
    return dirs, result


def test_three_periods_at_day_boundaries_lose_no_example(
    features: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dirs, (code, out, err) = _three_periods(
        capsys, features, tmp_path, "--eval-days", "1", "--validation-days", "2"
    )
    assert code == 0, err
    summary = json.loads(out)
    source = read_examples(features)
    days = event_time_ms(source) // DAY_MS
    first, last = int(days.min()), int(days.max())
    assert last - first == 3
    expected = {
        "train": days < last - 2,
        "val": (days >= last - 2) & (days < last),
        "eval": days == last,
    }
    for name, flag in (("train", "train"), ("val", "validation"), ("eval", "eval")):
        got = read_examples(dirs[name])
        assert summary[flag]["examples"] == got.num_rows == int(expected[name].sum())
        # Exactly the input's rows of those days, in the contract's schema.
        ids = source.filter(expected[name]).column("example_id").to_pylist()
        assert got.column("example_id").to_pylist() == ids
        assert read_timelines(dirs[name]).equals(read_timelines(features))
        # The feature job's layout: one folder per UTC day of the period.
        folders = sorted(p.name for p in (dirs[name] / "examples").iterdir())
        period_days = np.unique(event_time_ms(got) // DAY_MS)
        assert folders == [
            "date=" + str(np.datetime64(int(d), "D")) for d in period_days
        ]
        ExampleDataset(dirs[name], max_seq_len=8)  # trainer.training.fit reads it
    assert summary["eval"]["first_day"] == summary["eval"]["last_day"]
    assert sum(s["examples"] for s in summary.values()) == source.num_rows


def _input_day(features: Path, offset: int) -> str:
    """The UTC day ``offset`` days after the input's first, as YYYY-MM-DD."""
    first = int((event_time_ms(read_examples(features)) // DAY_MS).min())
    return str(np.datetime64(first + offset, "D"))


def test_a_cut_day_leaves_out_the_days_after_its_eval_period(
    features: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dirs, (code, out, err) = _three_periods(
        capsys, features, tmp_path,
        "--cut-day", _input_day(features, 2), "--validation-days", "1",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    source = read_examples(features)
    days = event_time_ms(source) // DAY_MS
    first = int(days.min())
    expected = {
        "train": days == first,
        "validation": days == first + 1,
        "eval": days == first + 2,
        "left_out": days == first + 3,
    }
    assert list(summary) == list(expected)
    for name, mask in expected.items():
        assert summary[name]["examples"] == int(mask.sum()) > 0
    for name, flag in (("train", "train"), ("val", "validation"), ("eval", "eval")):
        ids = source.filter(expected[flag]).column("example_id").to_pylist()
        assert read_examples(dirs[name]).column("example_id").to_pylist() == ids
    # The days after the eval period are counted and written nowhere.
    assert summary["left_out"]["dir"] is None
    assert summary["left_out"]["first_day"] == _input_day(features, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval", "train", "val"]
    assert sum(s["examples"] for s in summary.values()) == source.num_rows


def test_a_cut_at_the_last_days_is_the_default_split(
    features: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--input", str(features), "--train", str(tmp_path / "t")]
    argv += ["--eval", str(tmp_path / "e"), "--eval-days", "2"]
    code, default, _ = _split(capsys, *argv)
    assert code == 0
    code, cut, _ = _split(capsys, *argv, "--cut-day", _input_day(features, 2))
    assert code == 0
    assert json.loads(cut) == json.loads(default)
    assert "left_out" not in json.loads(cut)


def test_a_cut_day_that_is_not_a_day_is_a_usage_error(
    features: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--input", str(features), "--train", str(tmp_path / "t")]
    argv += ["--eval", str(tmp_path / "e"), "--cut-day", "2026-13-01"]
    with pytest.raises(SystemExit) as exited:
        split.main(argv)
    assert exited.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "python -m trainer.data.split: error: argument --cut-day: "
        "expected YYYY-MM-DD, got '2026-13-01'"
    )
    assert not (tmp_path / "t").exists()


def test_without_validation_two_periods(
    features: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _split(
        capsys, "--input", str(features), "--train", str(tmp_path / "t"),
        "--eval", str(tmp_path / "e"), "--eval-days", "2",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    assert set(summary) == {"train", "eval"}
    assert summary["train"]["examples"] + summary["eval"]["examples"] == (
        read_examples(features).num_rows
    )
    assert not (tmp_path / "validation").exists()


def test_a_second_split_replaces_the_first(
    features: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--input", str(features), "--train", str(tmp_path / "t")]
    argv += ["--eval", str(tmp_path / "e")]
    assert _split(capsys, *argv, "--eval-days", "1")[0] == 0
    (tmp_path / "e" / "teacher_outputs").mkdir()  # what trainer.distill adds
    code, out, _ = _split(capsys, *argv, "--eval-days", "3")
    assert code == 0
    assert json.loads(out)["eval"]["examples"] == read_examples(tmp_path / "e").num_rows
    assert not (tmp_path / "e" / "teacher_outputs").exists()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("too-many-days", "--input spans 4 UTC day(s); --eval-days 3 and "
         "--validation-days 1 leave no day to train on"),
        ("train-is-input", "--train"),
        ("overlap", "overlaps --train"),
        ("not-a-split-folder", "holds more than a split folder"),
        ("no-input", "no such folder"),
        ("not-features", "no examples/ Parquet files there"),
        ("cut-too-late", "1 UTC day(s) of --input from there, --eval-days 2"),
        ("cut-too-early", "leave no day to train on before --cut-day"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2(
    features: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    message: str,
) -> None:
    source, train, val, evals = features, tmp_path / "t", tmp_path / "v", tmp_path / "e"
    days = ["--eval-days", "1"]
    if case == "too-many-days":
        days = ["--eval-days", "3", "--validation-days", "1"]
    elif case == "train-is-input":
        train = features
    elif case == "overlap":
        val = train / "inner"
    elif case == "not-a-split-folder":
        evals.mkdir()
        (evals / "notes.txt").write_text("keep me")
    elif case == "no-input":
        source = tmp_path / "missing"
    elif case == "not-features":
        source = tmp_path / "empty"
        source.mkdir()
    elif case == "cut-too-late":
        days = ["--eval-days", "2", "--cut-day", _input_day(features, 3)]
    elif case == "cut-too-early":
        days = ["--eval-days", "1", "--cut-day", _input_day(features, 1)]
    code, out, err = _split(
        capsys, "--input", str(source), "--train", str(train),
        "--validation", str(val), "--eval", str(evals), *days,
    )  # fmt: skip
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("python -m trainer.data.split: error: ")
    assert message in lines[0]
    if case == "not-a-split-folder":
        assert (evals / "notes.txt").read_text() == "keep me"


def test_the_split_runs_without_torch(features: Path, tmp_path: Path) -> None:
    """Cutting files is Arrow work: the command never loads the trainer's model
    code (it answers in a second or two, not the ten torch takes here)."""
    script = (
        "import runpy, sys\n"
        "sys.argv = ['trainer.data.split', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_module('trainer.data.split', run_name='__main__')\n"
        "except SystemExit as stop:\n"
        "    assert stop.code == 0, stop.code\n"
        "print(sorted(m for m in ('torch', 'torchrec') if m in sys.modules))\n"
    )
    argv = ["--input", str(features), "--train", str(tmp_path / "t")]
    argv += ["--eval", str(tmp_path / "e")]
    done = run_python(script, *argv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
