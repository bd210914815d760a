"""Feast for the feature job: configuration and commands, the Arrow batch engine, the
online encoders, writers and stores.

``python -m pipelines.feast {validate,apply,materialize}`` runs the commands
(:mod:`.command`, on :mod:`.ops`).
"""
