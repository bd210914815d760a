"""Feast's own CLI on a copy of the repository, and our command's errors.

``feast -c feature_repo apply`` / ``materialize-incremental`` run as a user
runs them (the ``feast`` executable, in a subprocess) on a copy of the repo as
a fresh clone has it: no ``demo-output/``, nothing in ``feature_repo/data/``.
``python -m pipelines.feast`` turns what a user can fix (no tables, no
Redis, no PostgreSQL) into one line and exit status 2.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from feast import FeatureStore

from features import feast_repository
from features.config_flags import config_fields
from features.feature_tables import FEATURE_TABLES
from pipelines.feast import command as feast_command
from pipelines.feast import ops as feast_ops
from pipelines.feast import retrieval as feast_retrieval
from pipelines.feast.command import MaterializeConfig, StoreConfig

ROOT = Path(__file__).resolve().parents[1]
FEAST = Path(sys.executable).with_name("feast")
FEAST_VARIABLES = (
    "GEM_FEATURES_DIR",
    feast_repository.ENV_VAR,
    feast_repository.REDIS_VAR,
    feast_repository.REGISTRY_URL_VAR,
    "FEAST_FS_YAML_FILE_PATH",
)


def fresh_clone(root: Path) -> Path:
    """``feature_repo/`` copied under ``root`` as git checks it out: the
    declarations and the yamls, ``data/`` holding only its ``.gitignore``."""
    repo = root / "feature_repo"
    shutil.copytree(
        feast_repository.feature_repo(),
        repo,
        ignore=shutil.ignore_patterns("__pycache__", "data"),
    )
    (repo / "data").mkdir()
    shutil.copy(feast_repository.feature_repo() / "data" / ".gitignore", repo / "data")
    return repo


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any of the repository's Feast variables."""
    env = {k: v for k, v in os.environ.items() if k not in FEAST_VARIABLES}
    return {**env, **extra}


def feast(clone: Path, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(FEAST), "-c", "feature_repo", *args],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # Feast's import alone takes tens of seconds on a busy machine
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.integration
def test_feast_cli_applies_and_materializes_a_fresh_clone(tmp_path: Path) -> None:
    """No feature job has run: the sources read empty tables in the contract's
    schemas (written under data/empty_features/), the state lands in data/,
    and both documented commands succeed, materializing nothing."""
    clone = tmp_path / "clone"
    repo = fresh_clone(clone)
    env = clean_env()
    out = feast(clone, "apply", env=env)
    assert "Deploying infrastructure for user_sequence" in out
    feast(clone, "materialize-incremental", "2030-01-01T00:00:00", env=env)

    assert (repo / "data" / "registry.db").is_file()
    assert (repo / "data" / "online_store.db").is_file()
    assert not (clone / "demo-output").exists()
    empty = repo / "data" / "empty_features" / "feature_tables"
    for name, table in FEATURE_TABLES.items():
        written = pq.read_table(empty / name / "part-0.parquet")
        assert written.num_rows == 0
        assert written.schema.equals(table.schema), name
    store = FeatureStore(repo_path=str(repo))
    views = store.list_feature_views()
    assert {v.name for v in views} == set(FEATURE_TABLES)
    assert all(v.batch_source.path.startswith(str(empty)) for v in views)
    assert all(v.most_recent_end_time is not None for v in views)


def test_feast_ops_help_names_the_default_state_and_sources() -> None:
    text = feast_command.build_parser().format_help()
    assert "feature_repo/data/" in text
    assert "$GEM_FEATURES_DIR" in text


def test_the_materialize_flags_are_the_window_s_fields() -> None:
    parser = feast_command.build_parser()
    args = parser.parse_args(
        ["materialize", "--views", "a", "b", "--end", "2030-01-02"]
    )
    window = MaterializeConfig(**config_fields(args, MaterializeConfig))
    end = datetime(2030, 1, 2, tzinfo=UTC)
    assert window == MaterializeConfig(views=["a", "b"], end=end)
    before = datetime.now(UTC)
    args = parser.parse_args(["--project", "p", "validate"])
    assert StoreConfig(**config_fields(args, StoreConfig)) == StoreConfig(project="p")
    default = parser.parse_args(["materialize"])
    # Read once, when the flags are parsed: every view gets the same end.
    assert before <= default.end <= datetime.now(UTC)


def test_feast_ops_reads_the_contracts_time_column() -> None:
    from features import feature_tables

    assert feast_retrieval.EVENT_TIMESTAMP == feature_tables.EVENT_TIMESTAMP


def run_feast_ops(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.feast", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("python -m pipelines.feast: error: ")
    return line


def test_a_missing_features_dir_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-output"
    done = run_feast_ops(
        "--features-dir",
        str(missing),
        "--state-dir",
        str(tmp_path / "state"),
        "apply",
        env=clean_env(),
    )
    line = one_line_error(done)
    assert f"features dir {missing} does not exist" in line
    assert "python -m pipelines.build" in line


@pytest.mark.integration
def test_an_unreachable_registry_database_is_one_line(tmp_path: Path) -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    env = clean_env(
        **{
            feast_repository.ENV_VAR: "prod",
            feast_repository.REGISTRY_URL_VAR: "postgresql+psycopg://gem:secret@127.0.0.1:1/x",
            feast_repository.REDIS_VAR: "127.0.0.1:1",
        }
    )
    done = run_feast_ops("apply", env=env)
    line = one_line_error(done)
    assert "registry database at 127.0.0.1:1/x does not answer" in line
    assert "$GEM_FEAST_REGISTRY_URL" in line
    assert "secret" not in line


@pytest.mark.integration
def test_an_unreachable_redis_is_one_line(tmp_path: Path) -> None:
    """The registry answers (a SQLite file) and holds the views; Redis does not."""
    from tests.test_feast_store import make_feature_job

    job = make_feature_job(tmp_path / "features")
    env = clean_env(
        **{
            feast_repository.ENV_VAR: "prod",
            feast_repository.REGISTRY_URL_VAR: f"sqlite:///{tmp_path / 'registry.db'}",
            feast_repository.REDIS_VAR: "127.0.0.1:1",
        }
    )
    project = f"t_{uuid.uuid4().hex[:10]}"
    store = FeatureStore(
        config=feast_ops.repo_config(
            "prod",
            project=project,
            registry_url=env[feast_repository.REGISTRY_URL_VAR],
            redis="127.0.0.1:1",
        )
    )
    feast_ops.apply(store, job.directory)  # applying needs no Redis
    done = run_feast_ops("--project", project, "materialize", env=env)
    line = one_line_error(done)
    assert "no Redis answers at 127.0.0.1:1" in line
    assert "$GEM_FEAST_REDIS" in line


def test_prod_without_an_endpoint_is_one_line(tmp_path: Path) -> None:
    env = clean_env(**{feast_repository.ENV_VAR: "prod"})
    line = one_line_error(run_feast_ops("materialize", env=env))
    assert "the prod Feast configuration needs $GEM_FEAST_REGISTRY_URL" in line
