"""Steps 5 and 6 of ``make demo`` (:mod:`demos.end_to_end`): the Beam
feature job on the generated files, and its feature tables through Feast."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from demos.demo_config import DemoConfig
from features import feast_repository
from features.kafka import KafkaSettings

EXAMPLES_TOPIC = "gem.examples"


def build_features(
    cluster: KafkaSettings, config: DemoConfig
) -> tuple[dict[str, int], str]:
    """Step 5: the Beam feature job on the generated files in
    ``config.output``; returns its counts and the runner that ran it.

    Besides the files, it publishes the examples (with their timeline
    segments) to :data:`EXAMPLES_TOPIC` for the trainer daemon.
    """
    # Imported here: Beam takes a second to import, and steps 1-4 do not need it.
    from pipelines import build

    output = config.output
    started = time.monotonic()
    summary = build.run(
        [
            # The command users are told to run: DirectRunner, which runs it on Prism.
            "--runner=DirectRunner",
            "--input",
            str(output),
            "--output",
            str(output / "features"),
            "--kafka-bootstrap",
            str(cluster.bootstrap),
            "--examples-topic",
            EXAMPLES_TOPIC,
            # The daemon takes one step per message: the message size is its
            # batch size. Short histories keep each step cheap on a CPU.
            "--examples-per-message",
            str(config.batch_size),
            "--max-seq-len",
            str(config.max_seq_len),
            # Prism's own lines only when they are warnings or errors.
            "--prism_log_level=warn",
        ]
    )
    counts: dict[str, int] = summary["counts"]
    seconds = time.monotonic() - started
    print(
        f"  on {summary['runner']}: {counts['events_read']:,} events in "
        f"{seconds:.1f} s ({counts['events_read'] / max(seconds, 1e-9):,.0f} events/s)"
    )
    for name, value in counts.items():
        print(f"    {name:<22} {value:>12,}")
    return counts, str(summary["runner"])


def feature_job_checks(
    counts: dict[str, int], runner: str, impressions: int
) -> dict[str, bool]:
    """Step 5's checks: the job's counts add up, one example per generated
    ``impressions``, and Prism ran it."""
    return {
        "feature job counts add up (read = distinct + dups + dead letters)": (
            counts["events_read"]
            == counts["events_valid"] + counts["events_dead_lettered"]
            and counts["events_valid"]
            == counts["events_distinct"] + counts["duplicates_removed"]
        ),
        "one training example per distinct impression": (
            counts["impressions"] == counts["examples"] == impressions
        ),
        "the feature job ran on Prism (--runner=DirectRunner)": (
            runner == "PrismRunner"
        ),
    }


def feast_step(features_dir: Path) -> dict[str, bool]:
    """Step 6: the feature tables through Feast; returns the step's checks.

    Validates the tables, applies ``feature_repo/`` on them, materializes into
    the online store, reads one user back online, and checks a sample of
    training examples against Feast's point-in-time answer. The configuration
    is ``$GEM_FEAST_ENV`` (embedded by default, its registry and SQLite file
    under ``<output>/feast/``).
    """
    # Imported here: Feast takes seconds to import, and steps 1-5 do not need it.
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    from feast import FeatureStore

    from features.feature_tables import read_feature_table, table_folder, table_parts
    from pipelines.feast import ops as feast_ops
    from pipelines.feast import retrieval as feast_retrieval

    if not (features_dir / "feature_tables").is_dir():
        # No feature job ran before this step: make the tables with the
        # single-process reference job.
        from pipelines import reference as reference_command

        reference_command.main(
            ["--input", str(features_dir.parent), "--output", str(features_dir)]
        )
    env = feast_repository.feast_env()
    state = features_dir.parent / "feast"
    # Made anew, like the broker's log: an earlier run's registry would make
    # the incremental materialization start after this run's rows.
    shutil.rmtree(state, ignore_errors=True)
    store = FeatureStore(config=feast_ops.repo_config(env, state_dir=state))
    print(
        f"  configuration: {env} ({feast_ops.config_file(env).name}), state: {state}/"
    )
    started = time.monotonic()
    objects = feast_ops.apply(store, features_dir)
    print(
        f"  applied {len(objects.views)} feature views, {len(objects.services)} "
        f"services in {time.monotonic() - started:.1f} s"
    )
    started = time.monotonic()
    feast_ops.materialize(store, quiet=True)
    rows = sum(
        pq.ParquetFile(part).metadata.num_rows
        for n in objects.views
        for part in table_parts(table_folder(features_dir, n))
    )
    print(f"  materialized {rows:,} table rows in {time.monotonic() - started:.1f} s")

    counters = read_feature_table(features_dir, "user_counters")
    user = int(pc.mode(counters["user_id"])[0]["mode"].as_py())
    latest = (
        counters.filter(pc.equal(counters["user_id"], user))
        .sort_by([("event_timestamp", "descending")])
        .slice(0, 1)
        .to_pylist()[0]
    )
    started = time.monotonic()
    online = store.get_online_features(
        features=store.get_feature_service("user_context_v1"),
        entity_rows=[{"user_id": user}],
    ).to_dict()
    took_ms = (time.monotonic() - started) * 1000
    sequence = online["seq_item_id"][0] or []
    print(
        f"  online user_context_v1 for user {user} in {took_ms:.1f} ms: "
        f"{online['user_impression_count_1d'][0]:.0f} impressions in the last day, "
        f"device {online['user_device'][0]}, {len(sequence)} events in the sequence"
    )
    online_ok = all(
        online[name][0] == latest[name]
        for name in latest
        if name not in ("user_id", "event_timestamp")
    )

    examples = ds.dataset(features_dir / "examples", partitioning="hive").to_table(
        columns=["example_id", "event_time", *feast_retrieval.example_columns()]
    )
    sample = examples.to_pandas().sample(n=min(300, examples.num_rows), random_state=0)
    started = time.monotonic()
    mismatches = feast_retrieval.example_mismatches(store, sample)
    print(
        f"  {len(sample)} training examples vs Feast's point-in-time features in "
        f"{time.monotonic() - started:.1f} s: "
        + (f"mismatches {mismatches}" if mismatches else "identical")
    )
    return {
        "Feast online features = the user's latest rows": online_ok,
        "training examples = Feast point-in-time features (sample)": not mismatches,
    }
