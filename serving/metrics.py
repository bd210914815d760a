"""The service's Prometheus metrics, on a registry of its own (``/metrics``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
AGE_BUCKETS = (1, 10, 60, 300, 3600, 6 * 3600, 86_400, 7 * 86_400, 30 * 86_400)


class ServingMetrics:
    """Requests by status and reason, latency, model version and age, feature age."""

    def __init__(self, models: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "serving_requests",
            "score requests by HTTP status and reason",
            ["status", "reason"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "serving_request_seconds",
            "whole-request latency of /score",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.feature_age = Histogram(
            "serving_feature_age_seconds",
            "request time minus the newest feature row used",
            buckets=AGE_BUCKETS,
            registry=self.registry,
        )
        self.model_info = Gauge(
            "serving_model_info",
            "1 for the version each model serves",
            ["model", "version"],
            registry=self.registry,
        )
        self.model_age = Gauge(
            "serving_model_age_seconds",
            "now minus the newest example time the served version was trained on",
            ["model"],
            registry=self.registry,
        )
        self._models = models

    def refresh_models(self) -> None:
        """Set the model gauges from what is served now (before a scrape)."""
        self.model_info.clear()
        now_ms = time.time() * 1000
        for name, info in self._models().items():
            if info["version"] is None:
                continue
            self.model_info.labels(name, info["version"]).set(1)
            until = (info["trained_to"] or {}).get("trained_until_ms")
            if until is not None:
                self.model_age.labels(name).set((now_ms - until) / 1000)
