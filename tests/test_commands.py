"""Every ``python -m`` command explains itself: ``--help`` names the command,
lists the pinned flags, each with a line of help, and loads none of the heavy
frameworks (so it answers at once); an unknown flag exits 2 naming the
closest known one.

A flag added or removed shows up here first: update its command's set.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interpreter import run_python

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchrec", "fbgemm_gpu", "feast", "pandas", "pyarrow")
# Beam jobs list Beam's own options too, from a cache of Beam's table
# (pipelines.beam.beam_flags): Beam itself stays out of their --help.
BEAM_JOBS = {"pipelines.build"}

# Both daemons' serving exports (trainer.export.periodic.ServingExportConfig).
EXPORT_FLAGS = (
    "--artifacts",
    "--export-every-steps",
    "--export-every-minutes",
    "--keep-versions",
)
# Every command that talks to Kafka (features.kafka.add_kafka_arguments).
KAFKA_FLAGS: set[str] = {
    "--kafka-bootstrap",
    "--kafka-config",
    "--kafka-option",
    "--kafka-sasl-mechanism",
    "--kafka-sasl-password",
    "--kafka-sasl-password-file",
    "--kafka-sasl-username",
    "--kafka-security-protocol",
    "--kafka-ssl-cafile",
    "--kafka-ssl-certfile",
    "--kafka-ssl-keyfile",
}

# command -> the flags its --help lists (for the Beam jobs: the job's own
# flags; Beam's are checked by name below).
COMMANDS: dict[str, set[str]] = {
    "pipelines.feast": {"--env", "--features-dir", "--state-dir", "--project"},
    "pipelines.build": {
        "--input",
        "--output",
        "--max-seq-len",
        "--shards",
        "--now-ms",
        "--events-topic",
        "--kafka-group-id",
        "--examples-topic",
        "--examples-per-message",
        "--worker-threads",
        "--tune-allocator",
        "--no-tune-allocator",
        "--allowed-lateness-ms",
        "--out-of-orderness-ms",
        "--release-granularity-ms",
        "--entity-shards",
        "--stream-idle-seconds",
        "--stream-start",
        "--dead-letter-topic",
        "--feast-env",
        "--feast-state-dir",
        "--feast-project",
        "--freshness-jsonl",
        "--feature-repo",
        "--metrics-port",
    }
    | KAFKA_FLAGS,
    "pipelines.generate": {
        "--users",
        "--ads",
        "--days",
        "--seed",
        "--output",
        "--format",
        "--start",
        "--events-per-user-day",
        "--contents",
        "--duplicate-rate",
        "--drift-per-day",
        "--topic",
        "--partitions",
        "--rate",
    }
    | KAFKA_FLAGS,
    "pipelines.movielens": {"--source", "--output", "--overwrite"},
    "pipelines.reference": {"--input", "--output", "--now-ms", "--overwrite"},
    "pipelines.sources.bayes": {"--input", "--json"},
    "demos.end_to_end": {
        "--users",
        "--ads",
        "--days",
        "--seed",
        "--output",
        "--partitions",
        "--rate",
        "--preset",
        "--lr",
        "--batch-size",
        "--max-seq-len",
        "--window-examples",
        "--max-click-ne",
        "--min-click-auc",
        "--require-learning",
    }
    | KAFKA_FLAGS,
    "benchmarks.fuzz_decoders": {
        "--target",
        "--runs",
        "--report",
        "--jobs",
        "--max-seconds",
        "--timeout",
        "--seed",
        "--work",
    },
    "launchers.kafka_broker": {"--port", "--home", "--topic", "--sasl-user", "--log"},
    "trainer.fit": {
        "--artifacts",
        "--train",
        "--eval",
        "--validation",
        "--holdout",
        "--model",
        "--preset",
        "--epochs",
        "--batch-size",
        "--max-seq-len",
        "--lr",
        "--lr-schedule",
        "--embedding-lr",
        "--optimizer",
        "--max-steps-per-epoch",
        "--seed",
        "--threads",
        "--device",
        "--precision",
        "--patience",
        "--max-train-seconds",
        "--no-recalibrate",
        "--compile",
        "--metrics-out",
        "--save",
    },
    "trainer.data.split": {
        "--input",
        "--train",
        "--validation",
        "--eval",
        "--eval-days",
        "--cut-day",
        "--validation-days",
    },
    "trainer.daemon": {
        "--topic",
        "--group",
        "--checkpoint-dir",
        "--model",
        "--preset",
        "--lr",
        "--seed",
        "--checkpoint-every",
        "--keep",
        "--idle-seconds",
        "--max-steps",
        "--dead-letter",
        "--log-every",
        "--window-examples",
        "--metrics-jsonl",
        "--prometheus-port",
        "--metrics-address",
        "--start-fresh",
        "--on-offset-gap",
        "--tensorboard",
        "--plot",
        "--device",
        "--prior-click-rate",
        "--prior-conversion-rate",
        "--sharding",
        "--embedding-optimizer",
        "--embedding-lr",
        "--min-sharded-rows",
        "--threads",
        *EXPORT_FLAGS,
    }
    | KAFKA_FLAGS,
    "trainer.distill": {
        "--examples",
        "--eval",
        "--teacher",
        "--teacher-outputs",
        "--eval-teacher-outputs",
        "--teacher-max-seq-len",
        "--student",
        "--methods",
        "--domains",
        "--epochs",
        "--batch-size",
        "--lr",
        "--seed",
        "--kd-weight",
        "--kd-temperature",
        "--aux-weight",
        "--label-scale",
        "--grad-scale",
        "--adapter-lr",
        "--no-adapter-tracker",
        "--share-frozen",
        "--threads",
        "--metrics-out",
        "--artifacts",
    },
    "trainer.export": {"--checkpoint", "--artifacts", "--keep", "--max-seq-len"},
    "serving.versions": {"--artifacts", "--rollback", "--to"},
    "serving": {
        "--artifacts",
        "--host",
        "--port",
        "--feast-env",
        "--feast-state-dir",
        "--feast-project",
        "--feast-redis",
        "--feast-registry-url",
        "--max-candidates",
        "--pin",
        "--poll-seconds",
        "--threads",
    },
    "trainer.distill.daemon": {
        "--examples-topic",
        "--teacher-topic",
        "--group",
        "--domain",
        "--teacher",
        "--checkpoint-dir",
        "--methods",
        "--student",
        "--lr",
        "--seed",
        "--idle-seconds",
        "--teacher-wait-s",
        "--checkpoint-every",
        "--threads",
        "--start-fresh",
        "--on-offset-gap",
        "--prometheus-port",
        "--metrics-address",
        *EXPORT_FLAGS,
    }
    | KAFKA_FLAGS,
    "trainer.distill.teacher_outputs": {
        "--examples",
        "--teacher",
        "--output",
        "--batch-size",
        "--max-seq-len",
        "--threads",
    },
    "trainer.distill.teacher_stream": {
        "--examples-topic",
        "--output-topic",
        "--group",
        "--teacher",
        "--checkpoint-dir",
        "--idle-seconds",
        "--checkpoint-every",
        "--partitions",
        "--threads",
        "--start-fresh",
    }
    | KAFKA_FLAGS,
}

# command -> subcommand -> the flags its --help lists.
SUBCOMMANDS: dict[str, dict[str, set[str]]] = {
    "pipelines.feast": {
        "validate": set(),
        "apply": set(),
        "materialize": {"--start", "--end", "--views", "--engine"},
    },
}

_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9_-]*)")


def _help(module: str, *before: str) -> tuple[str, list[str]]:
    """``--help`` of ``module`` (after ``before``: a subcommand's) in a fresh
    interpreter, and what it loaded."""
    script = (
        "import json, runpy, sys\n"
        f"sys.argv = [{module!r}, *{list(before)!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
        "except SystemExit as stop:\n"
        "    assert stop.code in (0, None), stop.code\n"
        "print('\\x00' + json.dumps(sorted(sys.modules)))\n"
    )
    out = run_python(script, check=True).stdout
    text, _, modules = out.rpartition("\x00")
    return text, json.loads(modules)


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_help_lists_the_pinned_flags_and_stays_light(module: str) -> None:
    text, loaded = _help(module)
    assert text.startswith(f"usage: python -m {module} ")
    roots = {name.split(".")[0] for name in loaded}
    heavy = {*HEAVY, "apache_beam"}
    assert not roots & heavy, f"--help of {module} imports {sorted(roots & heavy)}"
    listed = set(_FLAG.findall(text)) - {"--help"}
    if module in BEAM_JOBS:
        assert {"--runner", "--direct_num_workers", "--streaming"} <= listed
        listed &= COMMANDS[module] | {"--log-level"}
    assert listed == COMMANDS[module] | {"--log-level"}


@pytest.mark.parametrize(
    ("module", "command"),
    [
        (module, command)
        for module, subs in sorted(SUBCOMMANDS.items())
        for command in subs
    ],
)
def test_subcommand_help_lists_the_pinned_flags_and_stays_light(
    module: str, command: str
) -> None:
    text, loaded = _help(module, command)
    assert text.startswith(f"usage: python -m {module} {command} ")
    roots = {name.split(".")[0] for name in loaded}
    assert not roots & {*HEAVY, "apache_beam"}
    assert set(_FLAG.findall(text)) - {"--help"} == SUBCOMMANDS[module][command]


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_unknown_flag_exits_2_with_the_closest(module: str) -> None:
    flag = max(COMMANDS[module], key=len)
    typo = flag[:-1] + ("x" if flag[-1] != "x" else "y")
    done = subprocess.run(
        [sys.executable, "-m", module, typo, "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert f"did you mean {flag}?" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
