"""Steps 1, 3 and 4 of ``make demo`` (:mod:`demos.end_to_end`): the
generated events, published to Kafka with a few malformed messages, and read
back in a consumer group with the checks that nothing was lost or changed."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import TYPE_CHECKING

from demos.demo_config import DemoConfig
from features.kafka import KafkaSettings, ensure_topics

if TYPE_CHECKING:
    import pyarrow as pa

    from pipelines.sources.synthetic import Generated

EVENTS_TOPIC = "gem.events.raw"
DEAD_LETTER_TOPIC = "gem.events.dead-letter"


def malformed_messages() -> tuple[bytes, ...]:
    """One malformed message of each kind the contract must reject with a reason."""
    from features.events import MIN_EVENT_TIME_MS

    return (
        b"\xff\xfe not UTF-8 at all",
        b'{"schema_version": 1, "event_id": "truncated',
        json.dumps({"schema_version": 1, "event_id": "no-user"}).encode(),
        json.dumps(
            {
                "schema_version": 1,
                "event_id": "bad-domain",
                "event_time": MIN_EVENT_TIME_MS + 1,
                "user_id": 1,
                "domain": "myspace",
                "surface": "feed",
                "action": "view",
                "content_id": 1,
            }
        ).encode(),
        json.dumps(
            {
                "schema_version": 1,
                "event_id": "far-future",
                "event_time": 4_102_444_800_000,  # 2100-01-01
                "user_id": 1,
                "domain": "facebook",
                "surface": "feed",
                "action": "view",
                "content_id": 1,
            }
        ).encode(),
    )


def generate(config: DemoConfig) -> Generated:
    """Step 1: the synthetic world into ``config.output``; prints its events'
    counts."""
    from pipelines.sources.synthetic import GeneratorConfig, generate_dataset

    started = time.monotonic()
    world = GeneratorConfig(
        users=config.users, ads=config.ads, days=config.days, seed=config.seed
    )
    data, _ = generate_dataset(world, config.output)
    print(f"  {data.events.num_rows:,} events in {time.monotonic() - started:.1f} s")
    _print_event_summary(data.events)
    return data


def _print_event_summary(events: pa.Table) -> None:
    import pyarrow.compute as pc

    counts = Counter(
        zip(events["domain"].to_pylist(), events["action"].to_pylist(), strict=True)
    )
    actions = sorted({a for _, a in counts})
    print(f"  {'domain':<10}" + "".join(f"{a:>12}" for a in actions))
    for domain in sorted({d for d, _ in counts}):
        row = "".join(f"{counts[(domain, a)]:>12,}" for a in actions)
        print(f"  {domain:<10}{row}")
    per_user = pc.value_counts(events["user_id"]).field("counts").to_numpy()
    print(
        f"  users: {per_user.size:,}; events per user: median "
        f"{int(sorted(per_user)[per_user.size // 2])}, max {int(per_user.max()):,}"
    )


def publish(
    cluster: KafkaSettings, events: pa.Table, config: DemoConfig
) -> tuple[int, int]:
    """Step 3: every event to :data:`EVENTS_TOPIC`, then the malformed
    messages; returns how many of each were sent."""
    from pipelines.sources.event_stream import publish_events, publish_raw

    ensure_topics(cluster, {EVENTS_TOPIC: config.partitions, DEAD_LETTER_TOPIC: 1})
    sent = publish_events(events, cluster, EVENTS_TOPIC, rate=config.rate)
    print(
        f"  published {sent.messages:,} events to {EVENTS_TOPIC} "
        f"({config.partitions} partitions, keyed by user) in {sent.seconds:.1f} s: "
        f"{sent.rate:,.0f} events/s, {sent.bytes / sent.seconds / 1e6:.1f} MB/s"
    )
    injected = publish_raw(malformed_messages(), cluster, EVENTS_TOPIC, key=b"bad")
    print(f"  injected {injected} malformed messages (the contract must reject them)")
    return sent.messages, injected


def read_back(
    cluster: KafkaSettings, events: pa.Table, sent: int, injected: int
) -> dict[str, bool]:
    """Step 4: the topic read back in a consumer group, its dead letters
    copied to :data:`DEAD_LETTER_TOPIC`; returns the step's checks."""
    import pyarrow.compute as pc

    from pipelines.sources.event_stream import read_events

    report = read_events(
        cluster,
        EVENTS_TOPIC,
        group_id=f"gem-demo-{int(time.time())}",
        dead_letter_topic=DEAD_LETTER_TOPIC,
    )
    valid = report.events
    print(
        f"  read {report.messages:,} messages in {report.seconds:.1f} s "
        f"({report.messages / max(report.seconds, 1e-9):,.0f}/s): "
        f"{valid.num_rows:,} valid + {len(report.dead_letters)} dead letters "
        f"(copied to {DEAD_LETTER_TOPIC})"
    )
    for reason, count in report.reasons.most_common():
        print(f"    {count} x {reason}")
    distinct = pc.count_distinct(valid["event_id"]).as_py()
    print(
        f"  distinct event ids: {distinct:,} "
        f"({valid.num_rows - distinct:,} at-least-once duplicates for the pipeline "
        "to drop)"
    )
    print(f"  users whose events arrived out of order: {report.out_of_order_users}")
    return {
        "every message accounted for (read = valid + dead letters)": (
            report.messages == sent + injected
            and valid.num_rows + len(report.dead_letters) == report.messages
        ),
        "valid events equal the generated events": _same_events(valid, events),
        "every malformed message dead-lettered": len(report.dead_letters) == injected,
        "per-user order kept": report.out_of_order_users == 0,
    }


def _same_events(got: pa.Table, want: pa.Table) -> bool:
    """Equal as multisets of rows (Kafka reorders across partitions)."""
    keys = [("event_id", "ascending"), ("event_time", "ascending")]
    return bool(got.sort_by(keys).equals(want.select(got.column_names).sort_by(keys)))
