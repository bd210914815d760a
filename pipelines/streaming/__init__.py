"""The feature job on an event stream (``python -m pipelines.build --streaming``).

Modules, one stage each: ``kafka_source`` (unbounded Kafka read, watermark,
lateness), ``user_state`` (per-user history and example release),
``entity_state`` (ad / advertiser counters), ``publish`` (exactly-once
example messages, dead letters), ``feast_push`` (online features),
``offsets`` (commit when durable), ``job`` (the pipeline and its flags);
``config`` and ``tables`` hold the shared timing rules and state schemas.
"""
