"""The contract every part of the system stands on.

``pipelines/`` and ``trainer/`` never import each other; what both need lives
here: the vocabularies (:mod:`features.vocab`), the raw event
(:mod:`features.events`), the dimension tables (:mod:`features.dimensions`),
the model's features (:mod:`features.registry`), training examples and
timelines (:mod:`features.examples`), quality metrics (:mod:`features.metrics`),
the Kafka settings and embedded broker (:mod:`features.kafka`) and the
allocator settings of processes that churn large arrays
(:mod:`features.memory`).

This package imports neither torch nor Apache Beam, so every process (a Beam
worker, the trainer, a Feast repository) can load it cheaply.
"""

from typing import Any

__all__ = ["SCHEMA_VERSION"]


def __getattr__(name: str) -> Any:
    # On first use: importing the package (every ``features.*`` module does)
    # must not load pyarrow, so that commands answer --help at once.
    if name == "SCHEMA_VERSION":
        from features.events import SCHEMA_VERSION

        return SCHEMA_VERSION
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
