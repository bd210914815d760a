"""The Polars peer's validation: the event rules as Polars expressions.

Every rule of :func:`features.event_table.event_table_reasons`, in its order,
is one boolean expression over the events frame; a row's first matching rule
is found for every row in one pass (:func:`first_rule`). Only the rejected
rows (a handful) then have their reason text written, in Python, by the rule's
formatter, so each reason is the validator's string exactly (values shown
with Python's ``repr``, as the validator shows them).

Polars holds strings as UTF-8 by construction, so the rule on invalid UTF-8
bytes has no expression: a Parquet file whose strings are not UTF-8 fails to
read (:mod:`benchmarks.polars_peer` says which file).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import polars as pl

from features import vocab
from features.events import (
    AD_FIELDS,
    EVENT_FIELDS,
    MAX_CLOCK_SKEW_MS,
    SURFACE_PAIRS,
    future_reason,
)
from features.fields import MAX_STRING_CHARS, length_reason

TIME_MS: Final = "_t"
"""The frame's column of ``event_time`` in epoch ms (the rules compare it)."""

Reason = str | Callable[[dict[str, Any]], str]
"""A rule's reason: the text, or how to write it from the rejected row."""


@dataclass(frozen=True)
class Rule:
    """One validation rule: where it matches, and its reason."""

    matches: pl.Expr
    reason: Reason

    def text(self, row: dict[str, Any]) -> str:
        """The reason of a row this rule rejected."""
        return self.reason if isinstance(self.reason, str) else self.reason(row)


def _field_rules() -> list[Rule]:
    """The per-field rules, field by field, in the validator's order."""
    rules: list[Rule] = []
    for spec in EVENT_FIELDS:
        name, column = spec.name, pl.col(spec.name)
        is_string = spec.kind.value == "string"
        if not spec.nullable:
            rules.append(Rule(column.is_null(), f"missing required field '{name}'"))
        if is_string:
            rules.append(
                Rule(
                    column.str.len_chars() > MAX_STRING_CHARS,
                    lambda row, n=name: length_reason(n, len(row[n])),
                )
            )
        if spec.allowed is not None:
            rules.append(
                Rule(
                    column.is_not_null() & ~column.is_in(list(spec.allowed)),
                    lambda row, n=name: f"field '{n}' has unknown value {row[n]!r}",
                )
            )
        if is_string and (spec.allowed is None or "" in spec.allowed):
            rules.append(Rule(column == "", f"field '{name}' must not be empty"))
        numeric = pl.col(TIME_MS) if spec.kind.value == "timestamp" else column
        value = TIME_MS if spec.kind.value == "timestamp" else name
        for bound, below, word in (
            (spec.min_value, True, "below the minimum"),
            (spec.max_value, False, "above the maximum"),
        ):
            if bound is None:
                continue
            limit = int(bound)
            rules.append(
                Rule(
                    numeric < limit if below else numeric > limit,
                    lambda row, n=name, v=value, b=bound, w=word: (
                        f"field '{n}' is {row[v]!r}, {w} {b}"
                    ),
                )
            )
    return rules


_SURFACES_OF: Final = {
    domain: sorted(s for d, s in SURFACE_PAIRS if d == domain)
    for domain in sorted({d for d, _ in SURFACE_PAIRS})
}


def _cross_field_rules() -> list[Rule]:
    """The rules that tie fields together, in the validator's order."""
    action = pl.col("action")
    is_ad = action.is_in(list(vocab.AD_ACTIONS)).fill_null(False)
    # One comparison per domain: cheaper than joining two strings per row.
    paired = pl.any_horizontal(
        (pl.col("domain") == domain) & pl.col("surface").is_in(surfaces)
        for domain, surfaces in _SURFACES_OF.items()
    )
    rules = [
        Rule(
            ~paired.fill_null(False),
            lambda row: (
                f"surface {row['surface']!r} does not belong to domain "
                f"{row['domain']!r}"
            ),
        )
    ]
    rules += [
        Rule(
            is_ad & pl.col(name).is_null(),
            lambda row, n=name: f"ad action {row['action']!r} is missing '{n}'",
        )
        for name in AD_FIELDS
    ]
    rules.append(
        Rule(
            is_ad & pl.col("content_id").is_not_null(),
            lambda row: f"ad action {row['action']!r} must not carry 'content_id'",
        )
    )
    rules.append(
        Rule(
            ~is_ad & pl.col("content_id").is_null(),
            lambda row: f"organic action {row['action']!r} is missing 'content_id'",
        )
    )
    rules += [
        Rule(
            ~is_ad & pl.col(name).is_not_null(),
            lambda row, n=name: (
                f"organic action {row['action']!r} must not carry '{n}'"
            ),
        )
        for name in AD_FIELDS
    ]
    needs = action.is_in(["click", "conversion"]).fill_null(False)
    has = pl.col("impression_id").is_not_null()
    rules.append(
        Rule(
            needs & ~has,
            lambda row: f"{row['action']!r} is missing 'impression_id'",
        )
    )
    rules.append(
        Rule(
            has & ~needs,
            lambda row: f"{row['action']!r} must not carry 'impression_id'",
        )
    )
    return rules


def event_rules(now_ms: int) -> list[Rule]:
    """Every rule, in the validator's order, with the clock ``now_ms``."""
    limit = now_ms + MAX_CLOCK_SKEW_MS
    future = Rule(
        pl.col(TIME_MS) > limit,
        lambda row: future_reason(row[TIME_MS], limit),
    )
    return [*_field_rules(), future, *_cross_field_rules()]


def first_rule(rules: list[Rule]) -> pl.Expr:
    """Index of the first rule each row breaks (null: the row is valid)."""
    return pl.coalesce(
        [
            pl.when(rule.matches.fill_null(False)).then(pl.lit(i, pl.Int32))
            for i, rule in enumerate(rules)
        ]
    )
