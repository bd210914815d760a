"""A generated world's tables and their reference feature job output, as the
benchmarks, the fault runs and the tests build them.

:func:`generated_tables` generates a world with
:mod:`pipelines.sources.synthetic`, in memory or through its files (what the
jobs read); :meth:`GeneratedTables.reference` runs
:func:`pipelines.core.reference.build_reference` on its tables at the
world's validation clock. :func:`generated_features` writes the feature
folder instead, as ``python -m pipelines.generate`` then ``python -m
pipelines.reference`` do. Nothing heavy is imported until one is called.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from pipelines.core.reference import ReferenceOutput
    from pipelines.sources.synthetic import GeneratorConfig


def add_world_arguments(
    parser: argparse.ArgumentParser, *, users: int, ads: int, days: int, seed: int = 0
) -> None:
    """``--users``, ``--ads``, ``--days`` and ``--seed`` of a generated world,
    with these defaults (:func:`world_config` reads them)."""
    parser.add_argument("--users", type=int, default=users)
    parser.add_argument("--ads", type=int, default=ads)
    parser.add_argument("--days", type=int, default=days)
    parser.add_argument("--seed", type=int, default=seed)


def world_config(args: argparse.Namespace, **options: Any) -> GeneratorConfig:
    """The world of the ``--users``, ``--ads``, ``--days`` and ``--seed`` flags;
    ``options`` set the other :class:`GeneratorConfig` fields."""
    from pipelines.sources.synthetic import GeneratorConfig

    return GeneratorConfig(
        users=args.users, ads=args.ads, days=args.days, seed=args.seed, **options
    )


@dataclass(frozen=True)
class GeneratedTables:
    """The event table and the users / ads / contents tables of one world."""

    config: GeneratorConfig
    events: pa.Table
    users: pa.Table
    ads: pa.Table
    contents: pa.Table

    @property
    def now_ms(self) -> int:
        """The clock the world's events are valid at (its period end + 1 day)."""
        from pipelines.sources.synthetic import validation_now_ms

        return validation_now_ms(self.config)

    def reference(self, events: pa.Table | None = None) -> ReferenceOutput:
        """The reference feature job on ``events`` (all of the world's when
        ``None``) with the world's dimension tables, at :attr:`now_ms`."""
        from pipelines.core.reference import build_reference

        return build_reference(
            self.events if events is None else events,
            self.users,
            self.ads,
            self.contents,
            now_ms=self.now_ms,
        )


def generated_tables(
    config: GeneratorConfig, directory: Path | None = None
) -> GeneratedTables:
    """Generate the world of ``config``: in memory, or, with ``directory``,
    written there as ``python -m pipelines.generate`` does and read back."""
    from pipelines.sources.synthetic import generate, generate_dataset

    if directory is not None:
        from pipelines.core.reference import read_input

        generate_dataset(config, directory)
        return GeneratedTables(config, *read_input(directory))
    from pipelines.sources.synthetic.world import ads_table, contents_table, users_table

    world = generate(config)
    return GeneratedTables(
        config,
        world.events,
        users_table(world.world.users),
        ads_table(world.world.ads),
        contents_table(world.world.contents),
    )


def generated_reference(
    config: GeneratorConfig, directory: Path | None = None
) -> ReferenceOutput:
    """The reference feature job's output on the world of ``config`` (see
    :func:`generated_tables`)."""
    return generated_tables(config, directory).reference()


def example_chunks(
    reference: ReferenceOutput, count: int, size: int, max_seq_len: int
) -> list[tuple[pa.Table, pa.Table]]:
    """``count`` slices of ``size`` examples, taken in turn around the
    examples table, each with its timeline segments of ``max_seq_len``."""
    from features.windows import timeline_segments

    rows = reference.examples.num_rows - size
    chunks = []
    for i in range(count):
        chunk = reference.examples.slice((i * size) % rows, size)
        chunks.append(
            (chunk, timeline_segments(chunk, reference.timelines, max_seq_len))
        )
    return chunks


def reference_features(source: Path, output: Path, *, overwrite: bool = False) -> Path:
    """``python -m pipelines.reference`` from the data set folder ``source``
    into ``output``; returns ``output``.

    Raises:
        RuntimeError: when the command fails.
    """
    from pipelines import reference as reference_command

    argv = ["--input", str(source), "--output", str(output)]
    if reference_command.main([*argv, *(["--overwrite"] if overwrite else [])]) != 0:
        raise RuntimeError(f"python -m pipelines.reference failed on {source}")
    return output


def generated_features(
    config: GeneratorConfig, source: Path, output: Path, *, overwrite: bool = False
) -> Path:
    """The world of ``config`` written to ``source``, and its reference
    feature folder in ``output`` (:func:`reference_features`); returns ``output``."""
    from pipelines.sources.synthetic import generate_dataset

    generate_dataset(config, source)
    return reference_features(source, output, overwrite=overwrite)
