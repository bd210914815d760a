"""Feast data sources on the feature job's Parquet outputs.

Each feature table of :data:`features.feature_tables.FEATURE_TABLES` is a
``FileSource`` on the folder of its parts, ``<features dir>/feature_tables/<name>/``
(the layout of :data:`~features.feature_tables.OUTPUT_LAYOUT`). Tables that a streaming
job updates between batch runs (the counters and the behaviour sequence) are
wrapped in a ``PushSource``, so ``store.push(...)`` writes fresh rows to the
online store while the batch source stays what training reads.

The features dir is ``$GEM_FEATURES_DIR``; else the demo's output
(``demo-output/features`` at the repository root) once the feature job has
written it; else, on a fresh clone, empty tables in the contract's schemas
that this file writes under ``data/empty_features/``, so that ``feast apply``
and ``feast materialize-incremental`` work before any data exists (and
materialize nothing). It is read when this file is imported (``feast apply``
imports it), so the registry records the path in force at apply time.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Final

import pyarrow.parquet as pq
from feast import FileSource, PushSource
from feast.data_format import ParquetFormat
from feast.data_source import DataSource

from features.feature_tables import EVENT_TIMESTAMP, FEATURE_TABLES, table_folder

FEATURES_DIR_ENV: Final = "GEM_FEATURES_DIR"
DEFAULT_FEATURES_DIR: Final = (
    Path(__file__).resolve().parents[1] / "demo-output" / "features"
)
EMPTY_FEATURES_DIR: Final = Path(__file__).resolve().parent / "data" / "empty_features"
"""Where the empty contract tables of a fresh clone go (git-ignored)."""
PUSHED_TABLES: Final = (
    "user_counters",
    "ad_counters",
    "advertiser_counters",
    "user_sequence",
)
"""Tables a streaming job updates online through their push source."""


def features_dir() -> Path:
    """The features dir in force: ``$GEM_FEATURES_DIR``, else the demo's output
    if the feature job wrote it, else :func:`empty_features_dir`."""
    configured = os.environ.get(FEATURES_DIR_ENV)
    if configured:
        return Path(configured).resolve()
    if (DEFAULT_FEATURES_DIR / "feature_tables").is_dir():
        return DEFAULT_FEATURES_DIR
    return empty_features_dir()


def empty_features_dir(directory: Path = EMPTY_FEATURES_DIR) -> Path:
    """``directory``, holding every feature table with no rows, in the
    contract's schema (written where missing); a features dir with no data."""
    for name, table in FEATURE_TABLES.items():
        path = table_folder(directory, name) / "part-0.parquet"
        if path.is_file():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside, then renamed: two processes importing this at once
        # never see half a file.
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        pq.write_table(table.schema.empty_table(), partial)
        partial.replace(path)
    return directory


def batch_source(name: str, directory: Path) -> FileSource:
    """The ``FileSource`` of feature table ``name`` under ``directory``."""
    return FileSource(
        name=f"{name}_source",
        path=str(table_folder(directory.resolve(), name)),
        file_format=ParquetFormat(),
        timestamp_field=EVENT_TIMESTAMP,
        description=FEATURE_TABLES[name].doc,
    )


def push_source_name(name: str) -> str:
    """The push source name of a pushed table (what ``store.push`` takes)."""
    return f"{name}_push"


def make_sources(directory: Path) -> dict[str, DataSource]:
    """The source each feature view reads, by table name.

    Pushed tables get a ``PushSource`` wrapping their ``FileSource`` (Feast
    uses the batch source for training and materialization, the push source
    for online writes); the others their ``FileSource``.
    """
    sources: dict[str, DataSource] = {}
    for name in FEATURE_TABLES:
        batch = batch_source(name, directory)
        sources[name] = (
            PushSource(name=push_source_name(name), batch_source=batch)
            if name in PUSHED_TABLES
            else batch
        )
    return sources


# No module-level name per source: `feast apply` registers each one through
# the view that reads it (views.py), its push source and the file beneath.
SOURCES: Final = make_sources(features_dir())
