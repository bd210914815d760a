"""The scoring service: ad requests scored from online features by exported models.

A wing of its own beside ``pipelines/`` and ``trainer/``, importing neither:
it stands on the contract in ``features/`` (the flat model inputs, the
artifact format), Feast's online store and the artifacts the trainer
exports. ``python -m serving --artifacts DIR`` starts it (``--help``).
"""
