"""Point-in-time reads of the feature store, and the training/serving check.

- :func:`historical_features`: point-in-time retrieval that returns one row
  per request row (see its docstring for the two Feast behaviours it guards);
- :func:`example_mismatches`: training examples against what Feast serves
  for them at their impression times (training/serving skew).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import pandas as pd
    from feast import FeatureService, FeatureStore

EVENT_TIMESTAMP: Final = "event_timestamp"
"""The feature tables' time column (``features.feature_tables.EVENT_TIMESTAMP``;
spelled out so that importing this module loads no pyarrow)."""


def _requested(
    store: FeatureStore, features: FeatureService | Sequence[str]
) -> dict[str, list[str]]:
    """Feature names by view, from a service or ``view:feature`` references."""
    from feast import FeatureService

    grouped: dict[str, list[str]] = {}
    if isinstance(features, FeatureService):
        for projection in features.feature_view_projections:
            names = [f.name for f in projection.features]
            grouped.setdefault(projection.name, []).extend(names)
        return grouped
    for ref in features:
        view, _, name = ref.partition(":")
        grouped.setdefault(view, []).append(name)
    return grouped


def _utc_ns(column: pd.Series) -> pd.Series:
    import pandas as pd

    return pd.to_datetime(column, utc=True).astype("datetime64[ns, UTC]")


def historical_features(
    store: FeatureStore,
    entity_df: pd.DataFrame,
    features: FeatureService | Sequence[str],
    *,
    full_feature_names: bool = False,
    timestamp_column: str = EVENT_TIMESTAMP,
) -> pd.DataFrame:
    """Point-in-time feature values for every row of ``entity_df``, in its order.

    For each view, the latest row with ``event_timestamp <= t`` of the row's
    entity, or nulls where the entity had none by ``t``. Calls Feast's
    ``get_historical_features`` once per view, on the distinct
    ``(join key, t)`` pairs, and joins the answers back, because Feast 0.67's
    file (Dask) offline store, called on the raw entity frame, loses rows:

    - an entity whose rows are *all* later than ``t`` drops the whole request
      row (its ttl filter keeps null matches but not "no match yet"), e.g. an
      impression in a user's first active hour has no ``user_sequence``
      snapshot yet, and Feast returns no row for it at all;
    - request rows that share a join key and timestamp are collapsed into one
      (a Feast bug), e.g. two impressions of one user at the same ms.

    Args:
        store: the applied store.
        entity_df: join key columns and ``timestamp_column``; other columns
            are kept.
        features: a feature service or ``view:feature`` references.
        full_feature_names: name columns ``view__feature``. Needed when a
            feature is named like a request column (``ad_profile``'s
            ``advertiser_id`` beside the advertiser key): plain names raise
            then, where Feast would silently rename one of them.
        timestamp_column: the request time column.

    Returns:
        ``entity_df`` plus one column per feature (nullable where missing).
    """
    out = entity_df.reset_index(drop=True).copy()
    times = _utc_ns(out[timestamp_column])
    request_ts = "__request_ts"
    out[request_ts] = times
    for view_name, names in _requested(store, features).items():
        view = store.get_feature_view(view_name)
        keys = [column.name for column in view.entity_columns]
        columns = [f"{view_name}__{n}" if full_feature_names else n for n in names]
        clashes = sorted(set(columns) & set(out.columns))
        if clashes:
            raise ValueError(
                f"features {clashes} of view {view_name!r} are named like columns "
                "already in the result; pass full_feature_names=True"
            )
        pairs = out[[*keys, request_ts]].drop_duplicates()
        pairs = pairs.rename(columns={request_ts: EVENT_TIMESTAMP})
        got = store.get_historical_features(
            entity_df=pairs,
            features=[f"{view_name}:{n}" for n in names],
            full_feature_names=full_feature_names,
        ).to_df()
        got[request_ts] = _utc_ns(got[EVENT_TIMESTAMP])
        got = got[[*keys, request_ts, *columns]]
        out = out.merge(got, on=[*keys, request_ts], how="left", validate="m:1")
    return out.drop(columns=[request_ts])


FROM_THE_EVENT: Final = ("advertiser_id", "campaign_id", "ad_format", "ad_objective")
"""``ad_profile`` features an example takes from its impression event instead."""


CONSISTENCY_VIEWS: Final = (
    "user_profile",
    "ad_profile",
    "user_counters",
    "ad_counters",
    "advertiser_counters",
)
"""The views whose values a training example holds too (not the sequence)."""


def example_columns() -> list[str]:
    """The example columns :func:`example_mismatches` reads (and ``event_time``)."""
    from features.feature_tables import FEATURE_TABLES

    names = [n for v in CONSISTENCY_VIEWS for n in FEATURE_TABLES[v].feature_names]
    return list(dict.fromkeys(["user_id", "ad_id", "advertiser_id", *names]))


def example_mismatches(store: FeatureStore, examples: pd.DataFrame) -> dict[str, int]:
    """Training/serving skew: examples whose feature differs from Feast's answer.

    Retrieves every :data:`CONSISTENCY_VIEWS` feature at each example's
    impression time and compares it with the example's column. Counters must
    be equal bit for bit (every counter table has a row at each impression
    time). Profile ids: Feast's null (no version yet) is the examples' missing
    id 0; :data:`FROM_THE_EVENT` ids are compared only where the ad has a
    version by then (before, the example has the event's, Feast nothing).

    Args:
        store: an applied store reading the same feature job's tables.
        examples: training examples (``training_example_schema`` columns).

    Returns:
        ``view.feature`` -> number of differing examples; empty when consistent.
    """
    from features.feature_tables import FEATURE_TABLES

    requests = examples[["user_id", "ad_id", "advertiser_id"]].assign(
        **{EVENT_TIMESTAMP: examples["event_time"]}
    )
    refs = [
        f"{view}:{name}"
        for view in CONSISTENCY_VIEWS
        for name in FEATURE_TABLES[view].feature_names
    ]
    served = historical_features(store, requests, refs, full_feature_names=True)
    no_ad_version = served["ad_profile__campaign_id"].isna().to_numpy()
    mismatches = {}
    for ref in refs:
        view, name = ref.split(":")
        got = served[f"{view}__{name}"]
        want = examples[name].to_numpy()
        if view.endswith("_counters"):
            same = got.to_numpy(dtype="float32", na_value=float("nan")) == want
        elif name in FROM_THE_EVENT:
            same = no_ad_version | (got.fillna(-1).to_numpy() == want)
        else:
            same = got.fillna(0).to_numpy(dtype="int64") == want
        if not same.all():
            mismatches[f"{view}.{name}"] = int((~same).sum())
    return mismatches
