"""Feast for the feature job: configuration and commands, the Arrow batch engine, the
online encoders and stores.

``python -m pipelines.feast {apply,materialize,...}`` runs the commands (:mod:`.ops`).
"""
