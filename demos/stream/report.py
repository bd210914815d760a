"""The figures of one streaming demo run's report, and the checks that its
counts add up ("nothing lost")."""

from __future__ import annotations

import math
from typing import Any

from demos.stream import freshness as fresh
from demos.stream.freshness import ExampleRecord, Sample

FRESHNESS = (
    ("event_to_example_beyond_window", "event -> example beyond window"),
    ("event_to_online_feature", "event -> Feast online value"),
    ("example_to_first_training_step", "example -> first training step"),
)
"""Each freshness: its key in the report, and its label on the screen and plot."""


def job_runner(summary: dict[str, Any]) -> dict[str, str | None]:
    """Which runner ran the job, and its Prism binary, from its summary."""
    return {"name": summary.get("runner", "unknown"), "prism": summary.get("prism")}


def examples_report(
    example_records: list[ExampleRecord], expected: set[Any]
) -> dict[str, int]:
    """The examples topic against the batch job's ``expected`` example ids:
    the stream must end with each of them on the topic exactly once."""
    ids = [i for _, ex in example_records for i in ex.column("example_id").to_pylist()]
    return {
        "examples_on_topic": len(ids),
        "examples_distinct": len(set(ids)),
        "examples_reference": len(expected),
        "examples_missing": len(expected - set(ids)),
        "examples_not_in_reference": len(set(ids) - expected),
    }


def freshness_samples(
    event_records: list[Any],
    example_records: list[ExampleRecord],
    pushes: list[dict[str, Any]],
    steps: list[dict[str, Any]],
) -> tuple[dict[str, list[Sample]], int]:
    """Each freshness's samples by its key in :data:`FRESHNESS`, and how many
    examples the final drain released."""
    released, drained = fresh.example_freshness(event_records, example_records)
    samples = {
        "event_to_example_beyond_window": released,
        "event_to_online_feature": fresh.feast_freshness(pushes),
        "example_to_first_training_step": fresh.trainer_freshness(
            example_records, steps
        ),
    }
    return samples, drained


def freshness_report(
    samples: dict[str, list[Sample]],
) -> dict[str, dict[str, float | None]]:
    """p50 / p99 in seconds and the count of each freshness."""
    return {
        key: fresh.percentiles([age for _, age in samples[key]]) for key, _ in FRESHNESS
    }


def trainer_report(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The trainer's last logged step: steps, examples and lifetime metrics."""
    if not steps:
        return None
    last = steps[-1]
    return {
        "steps": last["step"],
        "examples": last["examples"],
        # NaN (no positives yet) is not JSON: null instead.
        "lifetime": {
            key: {k: None if math.isnan(v) else v for k, v in values.items()}
            for key, values in last["lifetime"].items()
        },
    }


def checks(report: dict[str, Any], trainer: bool) -> dict[str, bool]:
    """The counts that must add up for "nothing lost"."""
    counts = report["counts"]
    read = counts.get("events_read", 0)
    released = counts.get("examples_published", 0)
    found = {
        "published == on topic == read": report["published"]["messages"]
        + report["malformed"]
        == report["events_on_topic"]
        == read,
        "read == valid + dead letters": read
        == counts.get("events_valid", 0) + counts.get("events_dead_lettered", 0)
        and counts.get("events_dead_lettered", 0) == report["dead_letters"],
        "released == on topic": released == report["examples_on_topic"],
        "on topic once each": report["examples_distinct"]
        == report["examples_on_topic"],
        "on topic == batch reference": report["examples_missing"]
        == report["examples_not_in_reference"]
        == 0,
    }
    if trainer:
        trained = report.get("trainer", {}).get("examples", 0)
        found["on topic == trained on"] = report["examples_on_topic"] == trained
    return found
