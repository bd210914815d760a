"""Feast batch engine: Parquet -> Arrow -> encoded bytes -> online store.

``feature_repo/feature_store*.yaml`` name it::

    batch_engine:
      type: pipelines.feast.engine.ArrowMaterializationEngine

so ``feast materialize`` / ``materialize-incremental``, ``store.materialize``
and ``python -m pipelines.feast materialize`` all run it. For each
feature view and window Feast hands it, it

1. finds, per entity, the latest row in the window and streams those rows'
   feature columns in batches of a few MB (:mod:`pipelines.feast.window_rows`);
2. encodes whole columns to Feast's serialized ``ValueProto`` bytes and entity
   keys (:mod:`pipelines.feast.encode`, equal byte for byte to Feast's
   converter);
3. writes them in Feast's own layout through the online store's client
   (:mod:`pipelines.feast.writers`): the guarded SQLite store's bulk writer,
   or Redis ``HSET`` commands in ``WATCH``/``MULTI``/``EXEC`` transactions
   behind a check of the stored event times (Feast's rule, a row not newer
   than the stored one is skipped, kept atomically:
   :mod:`pipelines.feast.redis_writer`).

Reading, encoding and writing run on three threads, two batches apart.
Whatever it does not cover (another source or store, a transformation, a
Redis cluster) runs Feast's own local engine.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from pipelines.feast.version import require_supported_feast

# Before Feast's internals are imported: another Feast may lack them or lay its
# data out differently, and this names the pin to install instead.
require_supported_feast()

import pyarrow.parquet as pq
from feast import FeatureView, FileSource
from feast.infra.common.materialization_job import (
    MaterializationJobStatus,
    MaterializationTask,
)
from feast.infra.compute_engines.local.compute import LocalComputeEngine
from feast.infra.compute_engines.local.job import LocalMaterializationJob
from feast.infra.registry.base_registry import BaseRegistry
from feast.repo_config import FeastConfigBaseModel
from feast.utils import make_tzaware

from features.feature_tables import table_parts
from features.memory import reuse_freed_memory
from features.prefetch import prefetch
from pipelines.feast.window_rows import batch_rows, latest_rows, window_batches
from pipelines.feast.writers import join_keys_of, online_writer

ENGINE_TYPE: Final = "pipelines.feast.engine.ArrowMaterializationEngine"

T = TypeVar("T")


class ArrowMaterializationEngineConfig(FeastConfigBaseModel):
    """``batch_engine`` settings of :class:`ArrowMaterializationEngine`."""

    type: Literal["pipelines.feast.engine.ArrowMaterializationEngine"] = (
        "pipelines.feast.engine.ArrowMaterializationEngine"
    )
    batch_rows: int = 20_000
    """Most rows encoded and written at once."""
    batch_bytes: int = 8 << 20
    """About this much decoded Parquet per batch: fewer rows for long
    sequences, so each batch's temporary arrays stay a few MB."""
    keep_freed_memory: bool = True
    """Keep freed memory in the process for reuse while materializing
    (:func:`features.memory.reuse_freed_memory`)."""


class ArrowMaterializationEngine(LocalComputeEngine):
    """Feast's local engine, with a columnar path for Parquet file sources.

    Historical retrieval and every view it does not cover are the local
    engine's (see the module docstring).
    """

    def __init__(
        self,
        batch_rows: int = 20_000,
        batch_bytes: int = 8 << 20,
        keep_freed_memory: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.keep_freed_memory = keep_freed_memory

    def _materialize_one(
        self, registry: BaseRegistry, task: MaterializationTask, **kwargs: Any
    ) -> LocalMaterializationJob:
        view = task.feature_view
        paths = columnar_parts(view, task)
        if paths is None:
            return super()._materialize_one(registry, task, **kwargs)
        job_id = f"{view.name}-{task.start_time}-{task.end_time}"
        try:
            self._materialize_parts(view, paths, task)
        except Exception as error:
            return LocalMaterializationJob(
                job_id=job_id, status=MaterializationJobStatus.ERROR, error=error
            )
        return LocalMaterializationJob(
            job_id=job_id, status=MaterializationJobStatus.SUCCEEDED
        )

    def _materialize_parts(
        self, view: FeatureView, paths: list[Path], task: MaterializationTask
    ) -> None:
        source = view.batch_source
        assert source is not None
        join_keys = join_keys_of(view)
        if len(join_keys) != 1:
            raise ValueError(f"view {view.name!r}: one join key expected")
        (entity,) = join_keys
        parts = [pq.ParquetFile(path) for path in paths]
        columns = [entity, source.timestamp_field, *(f.name for f in view.features)]
        keep = latest_rows(
            parts,
            entity,
            make_tzaware(task.start_time),
            make_tzaware(task.end_time),
            source.timestamp_field,
        )
        rows = batch_rows(parts, columns, self.batch_rows, self.batch_bytes)
        kept = sum(int(mask.sum()) for mask in keep)
        bar = task.tqdm_builder(kept) if task.tqdm_builder else None
        writer = online_writer(self.online_store, self.repo_config, self.batch_rows)
        # Three stages on three threads, two batches in flight between each:
        # Parquet decoding (Arrow's C++), encoding (numpy / Arrow) and the
        # store's writes (SQLite steps, the Redis socket) each release the GIL
        # for most of their time, so they overlap on two cores. Small batches
        # keep every temporary array small enough to be reused from the heap
        # the process keeps (features.memory) instead of faulted in anew.
        if self.keep_freed_memory:
            reuse_freed_memory()
        batches = prefetch(
            window_batches(parts, columns, keep, rows), name="feast-engine-read"
        )
        encoded = prefetch(
            (writer.encode(view, b, join_keys) for b in batches),
            name="feast-engine-encode",
        )
        with (
            contextlib.closing(batches),  # closed last, as the encoder stops first
            contextlib.closing(encoded),
        ):
            try:
                for batch in encoded:
                    writer.write(view, batch)
                    if bar is not None:
                        bar.update(len(batch))
            except BaseException:
                writer.finish(True)
                raise
            writer.finish(False)
        if bar is not None:
            bar.close()


def columnar_parts(view: Any, task: MaterializationTask) -> list[Path] | None:
    """The local Parquet files :class:`ArrowMaterializationEngine` reads for
    ``view`` (its source's file, or the parts of its source's folder), or None
    where Feast's own engine must run."""
    source = getattr(view, "batch_source", None)
    if (
        type(view) is not FeatureView  # batch / stream views: transformations
        or task.disable_event_timestamp
        or not isinstance(source, FileSource)
        or source.field_mapping
        or source.created_timestamp_column
        or len(view.entity_columns) != 1
    ):
        return None
    path = Path(source.path)
    if "://" in source.path:
        return None
    if path.is_dir():
        return table_parts(path) or None
    if path.suffix != ".parquet" or not path.is_file():
        return None
    return [path]
