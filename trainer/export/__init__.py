"""Serving artifacts from trained models: exported programs with their manifests
(the format is :mod:`features.serving_artifacts`)."""
