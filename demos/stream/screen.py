"""The one screen a streaming demo run prints at the end (``report.json``
has everything)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from demos.stream.report import FRESHNESS


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(report: dict[str, Any], output: Path) -> str:
    """The screen: the run, its counts, throughput, freshness and the trainer."""
    lines = [
        *_header(report),
        "",
        "counts (nothing lost)",
        *_counts(report),
        "",
        *_throughput(report),
        "",
        *_freshness(report),
        *_trainer(report.get("trainer")),
        "",
        f"report {output / 'report.json'}",
        f"plot   {report['plot']}",
    ]
    return "\n".join(lines)


def _header(report: dict[str, Any]) -> list[str]:
    lines = [
        f"demo-stream: {report['events']:,} events ({report['users']} users, "
        f"{report['days']} days) at {report['rate']:,.0f}/s; job on "
        f"{report['runner']['name']}",
    ]
    outage = report.get("broker_outage")
    if outage:
        lines.append(
            f"broker outage {outage['outage_seconds']:.1f} s: SIGKILL at "
            f"{outage['killed_at_s']:.1f} s, down {outage['down_asked_seconds']:g} s, "
            f"answering again at {outage['back_at_s']:.1f} s"
        )
    else:
        lines.append("broker: no outage (--broker-down-seconds 0)")
    return lines


def _counts(report: dict[str, Any]) -> list[str]:
    """A row per count, with the verdict of the checks it takes part in."""
    counts, checks, sent = report["counts"], report["checks"], report["published"]
    trained = report.get("trainer")

    def row(label: str, value: int, note: str = "", *names: str) -> str:
        verdict = "ok" if all(checks[n] for n in names) else "MISMATCH"
        return (
            f"  {label:<22}{value:>8,}  {note:<36}{verdict if names else ''}".rstrip()
        )

    lines = [
        row(
            "events published",
            sent["messages"] + report["malformed"],
            f"{sent['messages']:,} + {report['malformed']} malformed, "
            f"acked in {sent['seconds']:.1f} s",
        ),
        row(
            "on the events topic",
            report["events_on_topic"],
            "= published = read",
            "published == on topic == read",
        ),
        row(
            "read by the job",
            counts.get("events_read", 0),
            f"= {counts.get('events_valid', 0):,} valid "
            f"+ {counts.get('events_dead_lettered', 0):,} dead letters",
            "read == valid + dead letters",
        ),
        row("examples released", counts.get("examples_published", 0)),
        row(
            "on the examples topic",
            report["examples_on_topic"],
            "= released",
            "released == on topic",
        ),
        row(
            "distinct examples",
            report["examples_distinct"],
            f"= on the topic = batch job's {report['examples_reference']:,}",
            "on topic once each",
            "on topic == batch reference",
        ),
    ]
    twice = report["examples_on_topic"] - report["examples_distinct"]
    if twice or report["examples_missing"] or report["examples_not_in_reference"]:
        lines.append(
            f"{'':>34}{twice:,} more than once, {report['examples_missing']:,} "
            f"missing, {report['examples_not_in_reference']:,} not the batch job's"
        )
    if trained:
        lines.append(
            row(
                "trained on",
                trained["examples"],
                f"= on the topic ({trained['steps']} steps)",
                "on topic == trained on",
            )
        )
    lines.append(row("Feast rows pushed", counts.get("feast_rows_pushed", 0)))
    return lines


def _throughput(report: dict[str, Any]) -> list[str]:
    read = report["counts"].get("events_read", 0)
    return [
        f"job: {report['events_per_second']:,.1f} events/s ({read:,} in "
        f"{report['job_seconds']:.1f} s, start to exit; "
        f"{report['job_seconds_from_first_publish']:.1f} s after the first event)",
        f"     {_rate(report['online_events_per_second'])} events/s while live "
        "(first publish -> last event online)",
    ]


def _freshness(report: dict[str, Any]) -> list[str]:
    lines = [f"{'freshness, s':<33}{'p50':>6}  {'p99':>6}  {'samples':>7}"]
    for key, label in FRESHNESS:
        figures = report["freshness_s"][key]
        lines.append(
            f"  {label:<31}{_seconds(figures['p50']):>6}  "
            f"{_seconds(figures['p99']):>6}  {figures['n']:>7,}"
        )
    return lines


def _trainer(trained: dict[str, Any] | None) -> list[str]:
    """The trainer's lifetime NE / AUC per (domain, objective), if it ran."""
    if not trained:
        return []
    lines = [
        "",
        f"{'lifetime NE / AUC, step ' + str(trained['steps']):<32}"
        f"{'examples':>8}{'NE':>8}{'AUC':>8}",
    ]
    for key, values in sorted(trained["lifetime"].items()):
        lines.append(
            f"  {key:<30}{values['count']:>8,.0f}{_figure(values['ne']):>8}"
            f"{_figure(values['auc']):>8}"
        )
    return lines
