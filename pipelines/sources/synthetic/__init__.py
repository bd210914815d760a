"""A realistic synthetic ads world: users, ads, content, timelines, outcomes.

The pieces, each with one job:

- :mod:`~pipelines.sources.synthetic.params`: sizes and behavioural coefficients;
- :mod:`~pipelines.sources.synthetic.sampling`: vectorized categorical sampling;
- :mod:`~pipelines.sources.synthetic.world`: users, ads, contents and latent variables;
- :mod:`~pipelines.sources.synthetic.timelines`: sessions, organic events, impressions;
- :mod:`~pipelines.sources.synthetic.outcomes`: true probabilities, clicks, conversions;
- :mod:`~pipelines.sources.synthetic.assemble`: the event and truth tables;
- :mod:`~pipelines.sources.synthetic.writer`: files on disk, and reading events back.

One ``numpy.random.default_rng(seed)`` stream is consumed in a fixed order,
so the same configuration always gives byte-identical events.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from features.events import SCHEMA_VERSION
from pipelines.sources.generator_arguments import GeneratorArguments
from pipelines.sources.synthetic.assemble import TRUTH_SCHEMA, build_tables
from pipelines.sources.synthetic.outcomes import Outcomes, simulate_outcomes
from pipelines.sources.synthetic.params import (
    DAY_MS,
    GENERATOR_VERSION,
    GeneratorConfig,
    ModelParams,
)
from pipelines.sources.synthetic.timelines import BaseEvents, generate_timelines
from pipelines.sources.synthetic.world import (
    World,
    ads_table,
    build_world,
    contents_table,
    users_table,
)
from pipelines.sources.synthetic.writer import (
    EventFormat,
    read_events,
    write_events,
    write_manifest,
    write_table,
)

__all__ = [
    "GENERATOR_VERSION",
    "TRUTH_SCHEMA",
    "Generated",
    "GeneratorConfig",
    "ModelParams",
    "generate",
    "generate_dataset",
    "read_events",
    "validation_now_ms",
    "write_dataset",
]


@dataclass(frozen=True)
class Generated:
    """A generated data set in memory.

    Attributes:
        config: what was asked for.
        world: users, ads, contents and their latent variables.
        base: organic events and impressions (arrays, before assembly).
        outcomes: per-impression truth and realised outcomes.
        events: the event table (EVENT_SCHEMA, time order, duplicates adjacent).
        truth: one row per impression (TRUTH_SCHEMA).
        duplicates: events logged twice.
        counts: domain -> action -> events written (duplicates included).
        max_events_per_user: events of the most active user.
        users_with_events: users with at least one event.
    """

    config: GeneratorConfig
    world: World
    base: BaseEvents
    outcomes: Outcomes
    events: pa.Table
    truth: pa.Table
    duplicates: int
    counts: dict[str, dict[str, int]]
    max_events_per_user: int
    users_with_events: int


def generate(config: GeneratorConfig) -> Generated:
    """Generate a whole data set in memory.

    Args:
        config: sizes, period, seed and coefficients.

    Returns:
        The data set; same config, same result.
    """
    rng = np.random.default_rng(config.seed)
    world = build_world(config, rng)
    base = generate_timelines(config, world, rng)
    outcomes = simulate_outcomes(config, world, base, rng)
    tables = build_tables(
        base,
        outcomes,
        world.ads,
        seed=config.seed,
        duplicate_rate=config.duplicate_rate,
        rng=rng,
    )
    return Generated(
        config=config,
        world=world,
        base=base,
        outcomes=outcomes,
        events=tables.events,
        truth=tables.truth,
        duplicates=tables.duplicates,
        counts=tables.counts,
        max_events_per_user=tables.max_events_per_user,
        users_with_events=tables.users_with_events,
    )


def validation_now_ms(config: GeneratorConfig) -> int:
    """The clock to validate a data set's events with: period end + 1 day.

    Follow-ups of the last impressions spill past the period by less than the
    conversion window (1 day), so every event is "in the past" at this time.
    """
    return config.end_ms + DAY_MS


def manifest(data: Generated, fmt: EventFormat) -> dict[str, Any]:
    """What was generated: arguments, counts and version (no wall-clock time,
    so identical runs give identical manifests)."""
    config = data.config
    arguments = {
        f.name: getattr(config, f.name) for f in dataclasses.fields(GeneratorArguments)
    }
    arguments["start"] = config.start.isoformat()
    arguments["contents"] = config.n_contents
    arguments["format"] = fmt

    def iso(ms: int) -> str:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat()

    return {
        "generator_version": GENERATOR_VERSION,
        "schema_version": SCHEMA_VERSION,
        "seed": config.seed,
        "arguments": arguments,
        "params": dataclasses.asdict(config.params),
        "period": {"start": iso(config.start_ms), "end": iso(config.end_ms)},
        "validation_now_ms": validation_now_ms(config),
        "events": data.events.num_rows,
        "impressions": data.truth.num_rows,
        "duplicates": data.duplicates,
        "sessions": data.base.sessions,
        "counts": data.counts,
        "users_with_events": data.users_with_events,
        "max_events_per_user": data.max_events_per_user,
    }


def write_dataset(
    data: Generated, output_dir: Path | str, fmt: EventFormat = "parquet"
) -> dict[str, Any]:
    """Write events, dimension tables, truth and manifest under ``output_dir``.

    An earlier generator output in the same place is replaced (its day
    partitions would otherwise mix with the new ones); any other existing
    ``events/`` folder is refused rather than deleted.

    Args:
        data: the generated data set.
        output_dir: destination (created).
        fmt: event file format, ``parquet`` or ``jsonl`` (the other tables are
            always Parquet).

    Returns:
        The manifest.

    Raises:
        FileExistsError: ``output_dir/events`` exists and is not a generator
            output.
    """
    out = Path(output_dir)
    _clear_previous_output(out)
    out.mkdir(parents=True, exist_ok=True)
    write_events(data.events, out / "events", fmt)
    write_table(users_table(data.world.users), out / "users.parquet")
    write_table(ads_table(data.world.ads), out / "ads.parquet")
    write_table(contents_table(data.world.contents), out / "contents.parquet")
    write_table(data.truth, out / "truth.parquet")
    result = manifest(data, fmt)
    write_manifest(result, out / "manifest.json")
    return result


def _clear_previous_output(out: Path) -> None:
    events_dir = out / "events"
    if not events_dir.exists():
        return
    try:
        previous = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        previous = {}
    if "generator_version" not in previous:
        raise FileExistsError(
            f"{events_dir} exists and is not a generator output; "
            "choose another --output or remove it"
        )
    shutil.rmtree(events_dir)


def generate_dataset(
    config: GeneratorConfig, output_dir: Path | str, fmt: EventFormat = "parquet"
) -> tuple[Generated, dict[str, Any]]:
    """Generate and write a data set (what the CLI does).

    Returns:
        The in-memory data set and its manifest.
    """
    data = generate(config)
    return data, write_dataset(data, output_dir, fmt)
