"""The feature repository's definitions against the contract, and the Feast CLI.

One set of feature names runs through the pipeline's tables and examples, the
Feast views and services, and the trainer's embedding configs; these tests
hold them together, so a feature renamed or added in one place fails here.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from feast import FeatureStore
from feast.types import Array, Float32, Int32, Int64

from features import feast_repository
from features.examples import TIMELINE_SCHEMA, training_example_schema
from features.feature_tables import EVENT_TIMESTAMP, FEATURE_TABLES
from features.registry import DENSE_FEATURES, SEQUENCE_FEATURES, SPARSE_FEATURES
from pipelines.feast import ops as feast_ops
from tests.interpreter import run_python

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "feature_repo"

objects = feast_ops.repo_objects(ROOT / "demo-output" / "features")
views = feast_ops.repo_module("views")
services_module = feast_ops.repo_module("services")


def served_names(service: str) -> set[str]:
    """Feature names a service returns."""
    return {
        f.name
        for p in objects.services[service].feature_view_projections
        for f in p.features
    }


def test_each_feature_table_is_a_view_with_its_columns_and_types() -> None:
    assert set(objects.views) == set(FEATURE_TABLES)
    for name, table in FEATURE_TABLES.items():
        view = objects.views[name]
        assert view.entities == [table.entity.removesuffix("_id")]
        assert [c.name for c in view.entity_columns] == [table.entity]
        assert [f.name for f in view.features] == list(table.feature_names)
        for field in view.features:
            assert field.dtype == views.feast_dtype(table.schema.field(field.name).type)
        assert view.batch_source.timestamp_field == EVENT_TIMESTAMP
        assert view.batch_source.path.endswith(f"feature_tables/{name}")


def test_feast_types_follow_the_arrow_types() -> None:
    dtypes = {f.name: f.dtype for v in objects.views.values() for f in v.features}
    assert dtypes["user_device"] == Int64
    assert dtypes["ad_impression_count_7d"] == Float32
    assert dtypes["seq_item_id"] == Array(Int64)
    assert dtypes["seq_action"] == Array(Int32)
    assert dtypes["seq_event_time_ms"] == Array(Int64)
    with pytest.raises(TypeError, match="no Feast type"):
        views.feast_dtype(pa.dictionary(pa.int8(), pa.string()))
    with pytest.raises(TypeError, match="nested lists"):
        views.feast_dtype(pa.list_(pa.list_(pa.int64())))


def test_feast_pipeline_and_trainer_name_the_same_features() -> None:
    trainer_batch = pytest.importorskip("trainer.data.batch")
    keys = {t.entity for t in FEATURE_TABLES.values()}
    request = set(services_module.REQUEST_FEATURES)
    gem = served_names("gem_ranking_v1")
    sequence = served_names("user_context_v1") & {f.name for f in SEQUENCE_FEATURES}

    # The trainer embeds every registry sparse feature; Feast serves each one
    # (or it is an entity key, or comes with the request), and nothing else.
    sparse = set(trainer_batch.SPARSE_FEATURE_NAMES)
    assert sparse == {f.name for f in SPARSE_FEATURES}
    dense = {f.name for f in DENSE_FEATURES}
    non_sequential = gem - {c for c in gem if c.startswith("seq_")}
    assert non_sequential | keys | request == sparse | dense
    assert not request & gem

    # The pipeline's training examples carry exactly those columns.
    example_columns = set(training_example_schema().names)
    assert sparse | dense <= example_columns

    # Sequences: the timeline's per-event columns, plus event times (the
    # time bucket is derived from them at serving time, as from a timeline).
    timeline = {n for n in TIMELINE_SCHEMA.names if n.startswith("seq_")}
    assert sequence == timeline
    assert {c for c in gem if c.startswith("seq_")} == timeline | {"seq_event_time_ms"}
    assert {f.name for f in SEQUENCE_FEATURES} - sequence == {"seq_time_bucket"}
    assert set(trainer_batch.SEQUENCE_FEATURE_NAMES) == sequence | {"seq_time_bucket"}


def test_services_serve_the_models_they_name() -> None:
    assert not {c for c in served_names("vertical_ranking_v1") if c.startswith("seq_")}
    assert served_names("vertical_ranking_v1") < served_names("gem_ranking_v1")
    user_views = {
        p.name for p in objects.services["user_context_v1"].feature_view_projections
    }
    assert {FEATURE_TABLES[v].entity for v in user_views} == {"user_id"}


def test_pushed_tables_have_push_sources_over_their_files() -> None:
    pushed = {
        name: view.stream_source
        for name, view in objects.views.items()
        if view.stream_source is not None
    }
    assert set(pushed) == {
        "user_counters",
        "ad_counters",
        "advertiser_counters",
        "user_sequence",
    }
    for name, source in pushed.items():
        assert source.name == f"{name}_push"
        assert source.batch_source is objects.views[name].batch_source


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_feature_repo_imports_only_feast_and_features() -> None:
    # `feast apply` imports every .py here; keep it light (no torch, no Beam).
    siblings = {p.stem for p in REPO.glob("*.py")}
    allowed = {"feast", "features", "pyarrow", *siblings, *sys.stdlib_module_names}
    for path in REPO.glob("*.py"):
        assert _imported_roots(path) <= allowed, path.name


def test_one_env_var_switches_the_configuration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(feast_repository.ENV_VAR, raising=False)
    assert feast_ops.config_file() == REPO / "feature_store.yaml"
    local = feast_ops.repo_config(state_dir=tmp_path, project="p1")
    assert local.online_store.type == "pipelines.feast.sqlite.GuardedSqliteOnlineStore"
    assert local.online_store.path == str(tmp_path / "online_store.db")
    assert local.registry.path == str(tmp_path / "registry.db")
    assert local.project == "p1"
    # Without --state-dir: Feast's convention, data/ in the repository.
    default = yaml.safe_load((REPO / "feature_store.yaml").read_text())
    assert default["registry"]["path"] == "data/registry.db"
    assert default["online_store"]["path"] == "data/online_store.db"
    assert (REPO / "data" / ".gitignore").is_file()

    monkeypatch.setenv(feast_repository.ENV_VAR, "prod")
    assert feast_ops.config_file() == REPO / "feature_store.prod.yaml"
    prod = yaml.safe_load(feast_ops.config_file().read_text())
    # Feast's own Redis store; the endpoints from the environment.
    assert prod["online_store"]["type"] == "redis"
    assert prod["online_store"]["connection_string"] == "${GEM_FEAST_REDIS}"
    assert prod["registry"]["registry_type"] == "sql"
    assert prod["registry"]["path"] == "${GEM_FEAST_REGISTRY_URL}"
    # Both materialize with our engine (pipelines/feast/engine.py).
    assert prod["batch_engine"]["type"] == feast_ops.ENGINE_TYPE
    assert local.batch_engine_config["type"] == feast_ops.ENGINE_TYPE

    monkeypatch.setenv(feast_repository.ENV_VAR, "staging")
    with pytest.raises(ValueError, match="GEM_FEAST_ENV"):
        feast_ops.config_file()


def test_prod_endpoints_come_from_the_environment_and_none_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(feast_repository.REDIS_VAR, raising=False)
    monkeypatch.setenv(
        feast_repository.REGISTRY_URL_VAR, "postgresql+psycopg://f@pg:5432/f"
    )
    # No loopback fallback: a worker without the variable would write there.
    with pytest.raises(feast_repository.MissingEndpointError) as missing:
        feast_ops.repo_config("prod")
    assert str(missing.value) == (
        "the prod Feast configuration needs $GEM_FEAST_REDIS (the Redis online "
        "store, host:port[,db=N,password=...]); export it where the job and its "
        "workers run"
    )
    monkeypatch.setenv(feast_repository.REDIS_VAR, "")
    with pytest.raises(feast_repository.MissingEndpointError, match="GEM_FEAST_REDIS"):
        feast_ops.repo_config("prod")
    monkeypatch.delenv(feast_repository.REGISTRY_URL_VAR)
    with pytest.raises(
        feast_repository.MissingEndpointError, match="GEM_FEAST_REGISTRY"
    ):
        feast_ops.repo_config("prod", redis="h:1")
    feast_ops.repo_config("local")  # the embedded one has no endpoints

    monkeypatch.setenv(feast_repository.REDIS_VAR, "redis.internal:6380,db=2")
    monkeypatch.setenv(
        feast_repository.REGISTRY_URL_VAR, "postgresql+psycopg://f@pg:5432/f"
    )
    exported = feast_ops.repo_config("prod")
    assert exported.online_store.connection_string == "redis.internal:6380,db=2"
    assert exported.registry.path == "postgresql+psycopg://f@pg:5432/f"
    # Explicit arguments win over the environment.
    given = feast_ops.repo_config("prod", redis="h:1", registry_url="sqlite:///r.db")
    assert given.online_store.connection_string == "h:1"
    assert given.registry.path == "sqlite:///r.db"


def test_the_repository_is_found_by_variable_or_as_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(feast_repository.FEATURE_REPO_VAR, raising=False)
    assert feast_repository.feature_repo() == REPO
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in feast_repository.CONFIG_FILES.values():
        (copy / name).write_text((REPO / name).read_text().replace("gem_ads", "moved"))
    monkeypatch.setenv(feast_repository.FEATURE_REPO_VAR, str(copy))
    assert feast_ops.config_file("local") == copy / "feature_store.yaml"
    config = feast_ops.repo_config("local", state_dir=tmp_path / "state")
    assert config.project == "moved"
    assert Path(config.repo_path) == copy
    assert feast_repository.feature_repo(REPO) == REPO  # the flag wins
    with pytest.raises(FileNotFoundError, match="no feature repository"):
        feast_repository.feature_repo(tmp_path)


def test_variables_expand_as_feasts_cli_expands_them() -> None:
    text = "a: $ONE\nb: ${TWO}x\nc: ${UNSET}\nd: $$\n"
    values = {"ONE": "1", "TWO": "2"}
    assert (
        feast_repository.expand_variables(text, values)
        == "a: 1\nb: 2x\nc: ${UNSET}\nd: $$\n"
    )
    import posixpath

    with pytest.MonkeyPatch.context() as patch:
        for name, value in values.items():
            patch.setenv(name, value)
        patch.delenv("UNSET", raising=False)
        assert posixpath.expandvars(text) == feast_repository.expand_variables(
            text, values
        )


def test_feast_cli_applies_and_materializes_the_feature_job_output(
    tmp_path: Path,
) -> None:
    """``feast -c feature_repo apply`` and ``materialize-incremental``, as
    documented, with the embedded config's state moved into ``tmp_path``."""
    from tests.test_feast_store import make_feature_job

    job = make_feature_job(tmp_path / "features")
    config = yaml.safe_load((REPO / "feature_store.yaml").read_text())
    config["registry"]["path"] = str(tmp_path / "registry.db")
    config["online_store"]["path"] = str(tmp_path / "online_store.db")
    fs_yaml = tmp_path / "feature_store.yaml"
    fs_yaml.write_text(yaml.safe_dump(config))
    # Both commands in one interpreter: Feast's import alone takes seconds.
    script = (
        "import sys\n"
        "from feast.cli.cli import cli\n"
        "for args in (['apply'], ['materialize-incremental', sys.argv[1]]):\n"
        "    cli(['-c', 'feature_repo', '-f', sys.argv[2], *args],"
        " standalone_mode=False)\n"
    )
    env = dict(os.environ, GEM_FEATURES_DIR=str(job.directory))
    # Feast's import and CLI take tens of seconds on a busy machine.
    done = run_python(script, "2030-01-01T00:00:00", str(fs_yaml), env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Deploying infrastructure for user_sequence" in done.stdout
    store = FeatureStore(repo_path=str(REPO), fs_yaml_file=fs_yaml)
    # The CLI materialized with the yaml's engine (pipelines/feast/engine.py).
    assert store.config.batch_engine_config["type"] == feast_ops.ENGINE_TYPE
    user = int(job.output.feature_tables["user_profile"]["user_id"][0].as_py())
    got = store.get_online_features(
        features=["user_profile:user_device"], entity_rows=[{"user_id": user}]
    ).to_dict()
    assert got["user_device"][0] is not None
