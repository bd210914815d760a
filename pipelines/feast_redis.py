"""Feast's Redis online store, reading a feature service in one command per entity.

``feature_repo/feature_store.prod.yaml`` selects it::

    online_store:
      type: pipelines.feast_redis.SingleReadRedisOnlineStore

Feast's Redis store keeps every view of an entity in one hash (key:
serialized entity key + project; fields: ``mmh3("<view>:<feature>")`` and
``_ts:<view>``), yet reads a feature service with one ``HMGET`` per view and
entity (pipelined). This subclass groups the views that share the request's
entity rows and sends one ``HMGET`` per entity with all their fields, sent
on its own when there is one (no pipeline object), then hands each view's
slice of the reply to Feast's own decoding and response building. Layout,
writes, and everything else are Feast's: the stock store reads what this one
writes and the other way round.
"""

from __future__ import annotations

from typing import Any, Literal

from feast import utils
from feast.infra.online_stores.redis import (
    RedisClient,
    RedisOnlineStore,
    RedisOnlineStoreConfig,
    _versioned_fv_name,
)
from feast.repo_config import RepoConfig


class SingleReadRedisOnlineStoreConfig(RedisOnlineStoreConfig):
    """Config of :class:`SingleReadRedisOnlineStore` (Feast's Redis fields)."""

    type: Literal["pipelines.feast_redis.SingleReadRedisOnlineStore"] = (
        "pipelines.feast_redis.SingleReadRedisOnlineStore"  # type: ignore[assignment]
    )


class SingleReadRedisOnlineStore(RedisOnlineStore):
    """:class:`RedisOnlineStore` with one ``HMGET`` per entity across views."""

    def _read_features_per_fv(
        self,
        config: RepoConfig,
        grouped_refs: Any,
        join_key_values: Any,
        entity_name_to_join_key_map: Any,
        online_features_response: Any,
        full_feature_names: bool,
        include_feature_view_version_metadata: bool,
    ) -> None:
        if config.online_store.client == RedisClient.glide:
            super()._read_features_per_fv(
                config,
                grouped_refs,
                join_key_values,
                entity_name_to_join_key_map,
                online_features_response,
                full_feature_names,
                include_feature_view_version_metadata,
            )
            return
        # Views whose request rows map to the same Redis keys, in request order.
        groups: dict[tuple[bytes, ...], list[tuple[Any, ...]]] = {}
        for table, requested_features in grouped_refs:
            entity_values, idxs, output_len = utils._get_unique_entities(
                table, join_key_values, entity_name_to_join_key_map
            )
            fv_name = _versioned_fv_name(table, config)
            keys = tuple(
                self._generate_redis_keys_for_entities(
                    config, utils._get_entity_key_protos(entity_values)
                )
            )
            names, fields = self._generate_hset_keys_for_features(
                table, requested_features, fv_name_override=fv_name
            )
            groups.setdefault(keys, []).append(
                (table, names, fv_name, fields, idxs, output_len)
            )
        commands = [
            (key, [field for view in views for field in view[3]])
            for keys, views in groups.items()
            for key in keys
        ]
        if len(commands) == 1:
            client = self._get_client(config.online_store)
            replies = [client.hmget(*commands[0])]
        else:
            replies = self._read_hash_fields(config, commands)
        offset = 0
        for keys, views in groups.items():
            group = replies[offset : offset + len(keys)]
            offset += len(keys)
            start = 0
            for table, names, fv_name, fields, idxs, output_len in views:
                stop = start + len(fields)
                rows = self._convert_redis_values_to_protobuf(
                    [reply[start:stop] for reply in group], fv_name, names
                )
                start = stop
                utils._populate_response_from_feature_data(
                    names,
                    rows,
                    idxs,
                    online_features_response,
                    full_feature_names,
                    table,
                    output_len,
                    include_feature_view_version_metadata,
                )
