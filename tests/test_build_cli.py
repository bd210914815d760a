"""``python -m pipelines.build`` meets its user: every flag (the job's and
Beam's) checked before Beam loads, one line for what a user can fix, and the
worker tuning each runner gets.

The commands run in fresh interpreters, as a user runs them; the pinned
flags and the light ``--help`` are tests/test_commands.py's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser
from apache_beam.runners.runner import PipelineState

from features.config_flags import config_fields
from pipelines.batch.inputs import ReadEvents, find_event_files
from pipelines.batch.progress import files_read, follow
from pipelines.batch.tuning import (
    ONE_PROCESS,
    SHARED_MACHINE,
    TunedDoFn,
    WorkerTuning,
    runs_in_one_process,
    tuning_for,
)
from pipelines.batch.validate import ValidateEvents
from pipelines.beam import beam_flags
from pipelines.beam.flags import BuildConfig
from pipelines.beam.runner import use_local_prism
from pipelines.build import beam_argv, build_parser
from pipelines.generate import EVENT_FORMATS
from pipelines.sources.synthetic import GeneratorConfig, generate_dataset
from pipelines.sources.synthetic.writer import FORMATS
from pipelines.streaming.flags import StreamingJobConfig
from pipelines.streaming.job import StreamingOptions

ROOT = Path(__file__).resolve().parents[1]


def _build(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.build", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error line of a run that exited 2 with no traceback."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [x for x in done.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1, done.stderr
    return errors[0]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gen")
    generate_dataset(GeneratorConfig(users=30, ads=10, days=1, seed=2), root)
    return root


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("--shardz", "--shards"),
        ("--direct_num_worker", "--direct_num_workers"),
        ("--runer", "--runner"),
        ("--worker-thread", "--worker-threads"),
    ],
)
def test_a_misspelled_flag_of_the_job_or_beam_is_refused(
    typo: str, meant: str, tmp_path: Path
) -> None:
    done = _build(typo, "3", "--input", str(tmp_path), "--output", str(tmp_path))
    assert f"did you mean {meant}?" in _one_line_error(done)
    assert not (tmp_path / "summary.json").exists()


def test_a_runner_s_own_options_reach_beam() -> None:
    """Flink's options are its job server's, in no table of Beam's Python
    options: handed on as given, while near misses of known flags are not."""
    argv = ["--checkpointing_interval=5000", "--savepoint_path", "/s",
            "--shards", "2", "--direct_num_worker", "3", "--checkpointing_mode",
            "EXACTLY_ONCE", "--parallelism=2", "--worker-thread", "1"]  # fmt: skip
    passed = beam_flags.runner_options(argv, build_parser().known_flags())
    assert passed == ["--checkpointing_interval=5000", "--savepoint_path", "/s",
                      "--checkpointing_mode", "EXACTLY_ONCE"]  # fmt: skip
    assert beam_flags.without(argv, passed) == [
        "--shards", "2", "--direct_num_worker", "3", "--parallelism=2",
        "--worker-thread", "1"]  # fmt: skip
    options = PipelineOptions(beam_argv(argv))
    assert (
        options.get_all_options(retain_unknown_options=True)["checkpointing_interval"]
        == "5000"
    )


def test_a_runner_option_passes_the_command_and_the_runner_judges_it(
    dataset: Path, tmp_path: Path
) -> None:
    # The command takes it: what fails is the missing input, not the flag.
    line = _one_line_error(_build("--checkpointing_interval=5000", "--output", "o"))
    assert "--input is required" in line
    # A runner with no options of its own refuses it before the job starts.
    done = _build("--checkpointing_interval=5000", "--input", str(dataset),
                  "--output", str(tmp_path / "out"))  # fmt: skip
    line = _one_line_error(done)
    assert "--checkpointing_interval: neither Beam nor --runner=FnApiRunner" in line
    assert not (tmp_path / "out").exists()


def test_a_missing_input_is_one_line_naming_it(tmp_path: Path) -> None:
    line = _one_line_error(_build("--output", str(tmp_path / "o")))
    assert "--input is required" in line
    missing = tmp_path / "nowhere"
    line = _one_line_error(
        _build("--input", str(missing), "--output", str(tmp_path / "o"))
    )
    assert f"{missing}/events: no events directory" in line


def test_a_corrupt_input_is_one_line_and_debug_shows_the_traceback(
    dataset: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "in"
    subprocess.run(["cp", "-r", str(dataset), str(broken)], check=True)
    users = broken / "users.parquet"
    users.write_bytes(users.read_bytes()[:100])
    argv = ["--input", str(broken), "--output", str(tmp_path / "o")]
    line = _one_line_error(_build(*argv))
    assert f"{users}: unreadable Parquet file" in line
    debug = _build(*argv, "--log-level", "debug")
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr
    assert "InputFileError" in debug.stderr


def test_the_streaming_job_s_own_checks_are_one_line(tmp_path: Path) -> None:
    done = _build("--streaming", f"--input={tmp_path}", "--kafka-bootstrap=x:1")
    assert "--streaming needs --events-topic" in _one_line_error(done)


def test_a_run_prints_the_counts_and_writes_the_summary(
    dataset: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    done = _build("--input", str(dataset), "--output", str(out), "--shards", "2",
                  "--log-level", "warning")  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert f"examples: {summary['counts']['examples']:,}" in done.stdout
    assert summary["runner"] == "FnApiRunner"


def test_own_flags_stay_out_of_beam_s_argv() -> None:
    argv = ["--input", "x", "--log-level", "debug", "--shards=2", "--log-level=info"]
    assert beam_argv(argv) == ["--input", "x", "--shards=2"]


def test_the_cached_table_holds_every_flag_beam_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(beam_flags.CACHE_ENV, str(tmp_path))
    path = beam_flags.cache_path()
    assert path.parent == tmp_path
    assert beam_flags.beam_version() in path.name
    rows = beam_flags.beam_options()
    assert json.loads(path.read_text()) == rows
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in PipelineOptions.__subclasses__():
        if cls.__module__.startswith("apache_beam."):
            cls._add_argparse_args(parser)
    beams = {f for a in parser._actions for f in a.option_strings} - {"-h", "--help"}
    assert {flag for row in rows for flag in row["flags"]} == beams
    known = set(build_parser().known_flags())
    assert beams <= known
    # A corrupt cache is read from Beam again.
    path.write_text("{not json")
    assert beam_flags.beam_options() == rows


def test_the_generator_s_formats_are_the_writer_s() -> None:
    assert EVENT_FORMATS == FORMATS


def test_both_parsers_give_the_dataclasses_defaults_and_values() -> None:
    given = ["--input", "in", "--worker-threads", "2", "--no-tune-allocator"]
    changed = {"input": "in", "worker_threads": 2, "tune_allocator": False}
    command = build_parser()
    beam_view = PipelineOptions(given).view_as(StreamingOptions).get_all_options()
    for args in (command.parse_args(given), argparse.Namespace(**beam_view)):
        assert BuildConfig(**config_fields(args, BuildConfig)) == BuildConfig(**changed)
        streaming = StreamingJobConfig(**config_fields(args, StreamingJobConfig))
        assert streaming == StreamingJobConfig()
    args = command.parse_args(["--input", "in", "--worker-threads", "auto"])
    assert BuildConfig(**config_fields(args, BuildConfig)) == BuildConfig(input="in")


@pytest.mark.parametrize(
    ("runner", "flags", "alone"),
    [
        ("FnApiRunner", [], True),
        ("FnApiRunner", ["--direct_num_workers=2"], False),
        ("FnApiRunner", ["--direct_running_mode=multi_processing"], False),
        ("PrismRunner", [], True),
        ("PrismRunner", ["--environment_type=PROCESS"], False),
        ("PrismRunner", ["--sdk_worker_parallelism=2"], False),
        ("DirectRunner", [], True),
        ("DirectRunner", ["--direct_num_workers=4"], False),
        ("BundleBasedDirectRunner", [], True),
        ("FlinkRunner", [], False),
        ("DataflowRunner", [], False),
        ("PortableRunner", [], False),
    ],
)
def test_which_runners_run_the_job_in_one_process(
    runner: str, flags: list[str], alone: bool
) -> None:
    options = PipelineOptions(flags)
    assert runs_in_one_process(runner, options) is alone
    assert tuning_for(runner, options) == (ONE_PROCESS if alone else SHARED_MACHINE)


def test_the_flags_override_the_runner_s_default() -> None:
    local = PipelineOptions(["--worker-threads=0", "--no-tune-allocator"])
    assert tuning_for("FnApiRunner", local) == WorkerTuning(0, False)
    remote = PipelineOptions(["--worker-threads", "3", "--tune-allocator"])
    assert tuning_for("FlinkRunner", remote) == WorkerTuning(3, True)


def _tunings(pipeline: beam.Pipeline) -> set[WorkerTuning]:
    """The tuning of every TunedDoFn in the pipeline's graph."""
    found: set[WorkerTuning] = set()

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node: beam.pipeline.AppliedPTransform) -> None:
            fn = getattr(node.transform, "fn", None)
            if isinstance(fn, TunedDoFn):
                found.add(fn.tuning)

    pipeline.visit(Visitor())
    return found


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--runner=FnApiRunner"], ONE_PROCESS),
        (["--runner=FlinkRunner"], SHARED_MACHINE),
        (["--runner=FlinkRunner", "--worker-threads=2"], WorkerTuning(2, False)),
    ],
)
def test_the_graph_s_dofns_carry_the_runner_s_tuning(
    argv: list[str], expected: WorkerTuning
) -> None:
    pipeline = beam.Pipeline(options=PipelineOptions(argv))
    _ = pipeline | ReadEvents(["events/part-0.jsonl"]) | ValidateEvents(0)
    assert _tunings(pipeline) == {expected}


def test_the_progress_bar_counts_the_files_the_runner_reports_read(
    dataset: Path, tmp_path: Path
) -> None:
    """On Prism (a job server: ``run()`` returns while the job runs) the bar
    follows the job's ``event_files_read`` metric to the number of files."""
    files = find_event_files(str(dataset))
    extra = tmp_path / "more.jsonl"
    extra.write_text("not json\n")
    files.append(str(extra))
    options = PipelineOptions(["--runner=PrismRunner"])
    use_local_prism(options)
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | ReadEvents(files) | ValidateEvents(0)
    result = pipeline.run()
    follow(result, len(files), enabled=True)
    assert PipelineState.is_terminal(result.state)
    assert result.wait_until_finish() == PipelineState.DONE
    assert files_read(result) == len(files)
    # The in-process runner's result comes back finished: nothing to follow.
    local = beam.Pipeline(runner="FnApiRunner")
    _ = local | ReadEvents(files)
    done = local.run()
    follow(done, len(files), enabled=True)
    assert done.state == PipelineState.DONE
